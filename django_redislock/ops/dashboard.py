"""What the admin dashboard shows, as plain data: rows with holders and their
context, queued waiters, and the hot-names panel.

Every age is measured on the Redis server's clock (one ``TIME`` per page):
the web node's and the browser's clocks never enter. A holder's ``since`` is
the holder's own clock at acquire, so "held for" is off by the skew between
that holder and the Redis server, usually milliseconds under NTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_redislock import context
from django_redislock.backend import client as backend
from django_redislock.ops import history as hot
from django_redislock.ops import inspection
from django_redislock.ops.common import Page, edit_lease_text, holder_data, info_data

#: Waiters listed per row (the count is always complete).
WAITERS_SHOWN = 5
#: Windows (minutes) and orders the hot-names panel offers.
WINDOWS = (5, 15, 60)
ORDERS = ("waits", "timeouts", "lost", "wait_ms")


def server_time(client: Any) -> float:
    """The Redis server's clock, in seconds: the one clock every holder shares."""
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1_000_000


def who(holder: str) -> dict[str, str]:
    """``host``, ``pid``, ``thread`` and ``runs`` of a holder description."""
    ident, runs = context.split(holder)
    host, pid, thread = [*ident.split(":", 2), "", ""][:3]
    return {"host": host, "pid": pid, "thread": thread, "runs": runs}


@dataclass(frozen=True)
class Waiter:
    position: int  # 1 is next in line
    waited: float  # seconds since it queued
    holder: str


def _entry_holder(entry: bytes | str | None) -> str:
    """The holder in a waiter's deadlines entry, ``deadline:grant:holder`` (a
    permit waiter's grant is 0)."""
    if entry is None:
        return ""
    parts = backend.as_text(entry).split(":", 2)
    return parts[2] if len(parts) == 3 else ""


def waiters(
    client: Any,
    prefix: str,
    entries: Sequence[tuple[str, str]],
    *,
    now: float,
    limit: int = WAITERS_SHOWN,
) -> list[list[Waiter]]:
    """The first ``limit`` waiters of each ``(name, kind)``: two pipelined round trips.

    A queue's score is the waiter's arrival on the server's clock (µs); its
    deadlines entry also says who it is.
    """
    if not entries:
        return []
    parts = [getattr(inspection.kinds([kind])[0], "prefix", "") for _, kind in entries]
    pipe = client.pipeline(transaction=False)
    for (name, _), part in zip(entries, parts, strict=True):
        pipe.zrange(backend.key(prefix, name, f"{part}queue"), 0, limit - 1, withscores=True)
    queues = pipe.execute()
    for (name, _), part, queue in zip(entries, parts, queues, strict=True):
        tokens = [token for token, _ in queue] or ["-"]
        pipe.hmget(backend.key(prefix, name, f"{part}deadlines"), tokens)
    details = pipe.execute()
    return [
        [
            Waiter(position, max(0.0, now - score / 1_000_000), _entry_holder(entry))
            for position, ((_, score), entry) in enumerate(zip(queue, detail, strict=False), 1)
        ]
        for queue, detail in zip(queues, details, strict=True)
    ]


#: Kinds whose per-name counters are kept (``counters.py``); the others are
#: shown as not counted rather than as zeros (the hot-names panel has them all).
COUNTED_KINDS = frozenset({"lock", "leadership"})


def holders(info: inspection.HeldInfo, now: float) -> list[dict[str, Any]]:
    """``ops.holder_data`` plus each holder's context, ``held_for`` at ``now``
    (never negative: a holder's clock may run ahead of the server's), its
    ``lease``, whether the hold began as a handoff (``handed_over``) and,
    for a hold detached and waiting for its adopter, for how long
    (``detached_for``, else ``None``)."""
    found = holder_data(info)
    for data, holder in zip(found, info.holders, strict=True):
        data.update(who(holder.holder))
        data["held_for"] = None if holder.since is None else round(max(0.0, now - holder.since), 1)
        data["lease"] = holder.lease
        data["handed_over"] = holder.handed_over
        detached = holder.detached_since
        data["detached_for"] = None if detached is None else round(max(0.0, now - detached), 1)
        if data["edit_lease"] is not None:  # what it runs, in words: who edits what
            data["runs"] = "admin edit lease: " + edit_lease_text(data["edit_lease"])
    return found


def rows(page: Page, client: Any, prefix: str, *, now: float | None = None) -> list[dict[str, Any]]:
    """The page's rows as JSON-ready dicts: ``ops.info_data`` plus each holder's
    context and age (``held_for``) and the first waiters with theirs, all as
    of ``now`` on the server's clock (read here when not given)."""
    if now is None:
        now = server_time(client)
    found = page.rows()
    queued = [i for i, info in enumerate(page.infos) if info.waiters]
    lines = waiters(client, prefix, [(found[i]["name"], found[i]["kind"]) for i in queued], now=now)
    by_row = dict(zip(queued, lines, strict=True))
    for i, (row, info) in enumerate(zip(found, page.infos, strict=True)):
        row["holders"] = holders(info, now)
        row["held_for"] = max(
            (h["held_for"] for h in row["holders"] if h["held_for"] is not None), default=None
        )
        row["lease"] = max((h["lease"] for h in row["holders"] if h["lease"]), default=None)
        row["handed_over"] = any(h["handed_over"] for h in row["holders"])
        row["detached"] = any(h["detached_for"] is not None for h in row["holders"])
        row["counted"] = row["kind"] in COUNTED_KINDS
        row["queue"] = [
            {"position": w.position, "waited": round(w.waited, 1), **who(w.holder)}
            for w in by_row.get(i, [])
        ]
    return found


def hot_panel(client: Any, prefix: str, *, window: int, order: str) -> list[hot.NameHistory]:
    """The hot names over the last ``window`` minutes, with an hour of series."""
    history = hot.read(client, prefix, server_time(client), minutes=max(WINDOWS))
    return hot.hot_names(history, window=window, order=order)


def choice(value: str | None, allowed: Sequence[Any], default: Any) -> Any:
    """``value`` if it names one of ``allowed`` (compared as text), else ``default``."""
    for option in allowed:
        if str(option) == value:
            return option
    return default


#: Waiters listed on a name's own page (the count is always complete).
DETAIL_WAITERS = 100


def detail(client: Any, prefix: str, name: str, *, now: float) -> list[dict[str, Any]]:
    """Everything known about ``name``, one entry per kind that holds it (the
    twin of ``manage.py locks inspect``): ``ops.info_data`` plus holders with
    their context, lease and age, and up to ``DETAIL_WAITERS`` waiters in
    line. Empty when nothing holds the name."""
    infos = inspection.describe(client, prefix, name)
    found = []
    entries = [(info.name, info.kind) for info in infos]
    lines = waiters(client, prefix, entries, now=now, limit=DETAIL_WAITERS) if infos else []
    for info, line in zip(infos, lines, strict=True):
        data = info_data(info)
        data["holders"] = holders(info, now)
        data["lease"] = info.extra.get("lease")
        data["handed_over"] = any(h["handed_over"] for h in data["holders"])
        data["detached"] = any(h["detached_for"] is not None for h in data["holders"])
        data["counted"] = info.kind in COUNTED_KINDS
        data["queue"] = [
            {"position": w.position, "waited": round(w.waited, 1), **who(w.holder)} for w in line
        ]
        found.append(data)
    return found


def name_history(client: Any, prefix: str, name: str, *, now: float) -> hot.NameHistory | None:
    """``name``'s last hour of the hot-names history, or ``None`` when it has none."""
    history = [
        {name: minute[name]} if name in minute else {}
        for minute in hot.read(client, prefix, now, minutes=max(WINDOWS))
    ]
    for order in hot.COUNTERS:
        found = hot.hot_names(history, window=len(history), order=order, top=1)
        if found:
            return found[0]
    return None
