"""Read-only views of held primitives, and clearing them, for operators.

Each kind of primitive contributes a ``Kind`` (``ops/kinds.py``): the key
part that exists exactly while it is held (its *main part*), how to describe
one name from its keys, and how to clear it. ``manage.py locks`` and the admin dashboard go through
this module only, so a new primitive shows up in both by adding a ``Kind``.

Listing uses SCAN (never KEYS) with ``MATCH <prefix>:{*}:<main part>``.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.backend.values import HolderInfo, number
from django_redislock.holds import counters
from django_redislock.ops.kinds import (
    CHANGED_HANDS,
    SCRIPT_BATCH,
    UNREADABLE,
    HeldInfo,
    Kind,
    LeadershipKind,
    LockKind,
    RWLockKind,
    SemaphoreKind,
)
from django_redislock.ops.once import IdempotencyKind, OnceKind

__all__ = [
    "CHANGED_HANDS",
    "DESCRIBE_BATCH",
    "KINDS",
    "SCRIPT_BATCH",
    "STAT_FIELDS",
    "UNREADABLE",
    "HeldInfo",
    "HolderInfo",
    "Kind",
    "LeadershipKind",
    "LockKind",
    "RWLockKind",
    "SemaphoreKind",
    "clear",
    "clear_many",
    "describe",
    "describe_many",
    "held_names",
    "holders_signature",
    "kinds",
    "list_held",
    "stats",
]


def holders_signature(info: HeldInfo) -> str:
    """Who holds a name, as an operator confirmed it: digests of its holders'
    tokens (unique per hold; the tokens themselves stay out of pages), sorted.
    A force-release compares it with the holders it reads, then clears only
    if those still hold the name (``Kind.clear``'s ``confirmed``), so that a
    name that changed hands meanwhile is not cleared from under a holder
    nobody was shown."""
    digests = (hashlib.sha256(h.token.encode()).hexdigest()[:16] for h in info.holders)
    return ",".join(sorted(digests))


#: Every kind the tools know about; primitives add theirs here.
KINDS: list[Kind] = [
    LockKind(),
    SemaphoreKind(),
    RWLockKind(),
    LeadershipKind(),
    IdempotencyKind(),
    OnceKind(),
]


def kinds(selected: Iterable[str] | None = None) -> list[Kind]:
    if selected is None:
        return list(KINDS)
    wanted = set(selected)
    unknown = wanted - {k.kind for k in KINDS}
    if unknown:
        raise ValueError(
            f"Unknown kind(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(k.kind for k in KINDS)}."
        )
    return [k for k in KINDS if k.kind in wanted]


def held_names(
    client: Any, prefix: str, kind: Kind, pattern: str | None = None, *, count: int = 1000
) -> Iterator[str]:
    """Names of ``kind`` held now (SCAN; a name may repeat if keys move during the scan)."""
    match = f"{_glob_escape(prefix)}:{{*}}:{kind.main_part}"
    owns = getattr(kind, "owns", None)  # kinds sharing a main part tell their names apart
    for raw in backend.scan(client, match, count=count):
        parsed = backend.parse_key(prefix, raw)
        if parsed is None or parsed[1] != kind.main_part:
            continue
        name = parsed[0]
        if owns is not None and not owns(name):
            continue
        if pattern is None or fnmatch.fnmatchcase(name, pattern):
            yield name


#: Names described per pipelined round trip: big enough to amortise the round
#: trip, small enough that the pipeline's replies stay a few hundred KB.
DESCRIBE_BATCH = 500


def describe_many(
    kind: Kind, client: Any, prefix: str, names: Sequence[str], *, batch: int = DESCRIBE_BATCH
) -> Iterator[HeldInfo]:
    """Describe ``names`` of ``kind``, pipelined in batches when the kind can.

    A kind may offer ``describe_many(client, prefix, names)`` answering one
    ``HeldInfo | None`` per name; kinds without it are described one by one.
    Every command sent is O(1) or O(holders), so no single command blocks the
    server however many names there are.
    """
    many = getattr(kind, "describe_many", None)
    for start in range(0, len(names), batch):
        chunk = names[start : start + batch]
        infos = (
            many(client, prefix, chunk)
            if many
            else [kind.describe(client, prefix, n) for n in chunk]
        )
        yield from (info for info in infos if info is not None)


def clear_many(
    kind: Kind,
    client: Any,
    prefix: str,
    names: Sequence[str],
    *,
    batch: int = DESCRIBE_BATCH,
    confirmed: Mapping[str, HeldInfo] | None = None,
) -> Iterator[tuple[str, int]]:
    """Clear ``names`` of ``kind`` in batches; yields ``(name, holders released)``.

    With ``confirmed`` (each name as the operator was shown it), a name is
    cleared only if those holders still hold it, else it answers
    ``CHANGED_HANDS`` (see ``Kind.clear``). Without, a kind that only has
    ``clear(client, prefix, name)`` still works.
    """
    many = getattr(kind, "clear_many", None)
    held_by = {} if confirmed is None else {"confirmed": confirmed}
    for start in range(0, len(names), batch):
        chunk = names[start : start + batch]
        if many:
            counts = many(client, prefix, chunk, **held_by)
        elif confirmed is None:
            counts = [kind.clear(client, prefix, n) for n in chunk]
        else:
            counts = [kind.clear(client, prefix, n, confirmed=confirmed[n]) for n in chunk]
        yield from zip(chunk, counts, strict=True)


def list_held(
    client: Any,
    prefix: str,
    *,
    pattern: str | None = None,
    selected: Iterable[str] | None = None,
) -> list[HeldInfo]:
    """Every held primitive, sorted by (name, kind)."""
    found: list[HeldInfo] = []
    for kind in kinds(selected):
        names = sorted(set(held_names(client, prefix, kind, pattern)))
        found.extend(describe_many(kind, client, prefix, names))
    found.sort(key=lambda info: (info.name, info.kind))
    return found


def describe(client: Any, prefix: str, name: str) -> list[HeldInfo]:
    """What every kind knows about ``name`` (usually one entry, or none)."""
    return [info for kind in KINDS if (info := kind.describe(client, prefix, name)) is not None]


def clear(client: Any, prefix: str, name: str) -> int:
    """Release every holder of ``name`` of every kind; returns how many were released."""
    return sum(kind.clear(client, prefix, name) for kind in KINDS)


def stats(client: Any, prefix: str, names: Sequence[str]) -> list[dict[str, int]]:
    """The usage counters of each name (empty when counting is off or the name is idle).

    This process's own pending counts are written first (``counters.flush``,
    each client's write bounded by ``counters.WRITE_TIMEOUT``), so what it did
    itself is never missing; other processes' counts may be up to
    ``background.FLUSH_SECONDS`` behind.
    """
    counters.flush()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(backend.key(prefix, name, "stats"))
    found = []
    for reply in pipe.execute():
        # fields this version does not count are left out
        fields = ((backend.as_text(k), number(backend.as_text(v))) for k, v in reply.items())
        found.append({k: n for k, n in fields if k in STAT_FIELDS and n is not None})
    return found


#: Counters kept per name (see ``backend/scripts/_stats.lua`` and ``holds/counters.py``).
STAT_FIELDS = ("acquired", "contended", "waited", "lost", "wait_ms")


def _glob_escape(text: str) -> str:
    """``text`` matched literally by SCAN's MATCH (a cache's KEY_PREFIX may hold ``*``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
