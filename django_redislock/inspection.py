"""Read-only views of held primitives, and clearing them, for operators.

Each kind of primitive contributes a ``Kind``: the key part that exists exactly
while it is held (its *main part*), how to describe one name from its keys,
and how to clear it. ``manage.py locks`` and the admin dashboard go through
this module only, so a new primitive shows up in both by adding a ``Kind``.

Listing uses SCAN (never KEYS) with ``MATCH <prefix>:{*}:<main part>``.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from redis.exceptions import ResponseError

from . import backend, counters
from .state import (
    HolderInfo,
    LockState,
    as_text,
    number,
    parse_holders,
    parse_lock_value,
    parse_member,
)


@dataclass(frozen=True)
class HeldInfo:
    """One held name of one kind."""

    name: str
    kind: str
    holders: list[HolderInfo]
    limit: int | None = None  # semaphores
    waiters: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ttl(self) -> float | None:
        ttls = [h.ttl for h in self.holders if h.ttl is not None]
        return max(ttls) if ttls else None

    @property
    def fencing_token(self) -> int | None:
        tokens = [h.fencing_token for h in self.holders if h.fencing_token is not None]
        return max(tokens) if tokens else None


def holders_signature(info: HeldInfo) -> str:
    """Who holds a name, as an operator confirmed it: digests of its holders'
    tokens (unique per hold; the tokens themselves stay out of pages), sorted.
    A force-release checks it again just before it clears, so that a name
    that changed hands meanwhile is not cleared from under a holder nobody
    was shown."""
    digests = (hashlib.sha256(h.token.encode()).hexdigest()[:16] for h in info.holders)
    return ",".join(sorted(digests))


class Kind(Protocol):
    kind: str
    main_part: str

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        """Everything known about ``name``; ``None`` when it is not held."""

    def clear(self, client: Any, prefix: str, name: str) -> int:
        """Release every holder of ``name``; returns how many were released.

        Holders are not told directly: their next renewal or release finds the
        lease gone and reports ``LockLostError`` / ``lock_lost``.
        """


def _waiters(client: Any, prefix: str, name: str) -> int:
    return int(client.zcard(backend.key(prefix, name, "queue")))


#: Who holds a lock whose value cannot be read (``LockKind.describe_many``).
UNREADABLE = "unknown (a value this version cannot read; clear it to free the name)"

#: Names one operator script call reads or clears: about 0.1 ms of server time,
#: so a listing or a mass clear never blocks other clients noticeably.
SCRIPT_BATCH = 100


class LockKind:
    kind = "lock"
    main_part = "lock"
    prefix = ""  # of the queue parts

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        return self.describe_many(client, prefix, [name])[0]

    def describe_many(
        self, client: Any, prefix: str, names: Sequence[str]
    ) -> list[HeldInfo | None]:
        """``describe`` for many names: GET and PTTL of every lock in one script
        call per batch (pipelined per name on Cluster), then ZCARD only for the
        few locks whose value says waiters may be queued. Each read is O(1) and
        a batch is a few hundred names, so no command blocks the server."""
        from .scripts import INSPECT_LOCKS

        keys = [backend.key(prefix, name, "lock") for name in names]
        if backend.is_cluster(client):
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            # a key of another type fails its GET only (read as unreadable)
            replies: list[Any] = [
                "" if isinstance(reply, ResponseError) else reply
                for reply in pipe.execute(raise_on_error=False)
            ]
        else:  # a script call per SCRIPT_BATCH names: far less client work than 2 per name
            INSPECT_LOCKS.ensure_loaded(client)
            pipe = client.pipeline(transaction=False)
            for start in range(0, len(keys), SCRIPT_BATCH):
                batch = [{"lock": key} for key in keys[start : start + SCRIPT_BATCH]]
                INSPECT_LOCKS.queue(
                    pipe,
                    INSPECT_LOCKS.keys_of_each(batch),
                    INSPECT_LOCKS.args_of_each([{}] * len(batch)),
                )
            replies = [item for reply in pipe.execute() for item in reply]
        states = [parse_lock_value(value) for value in replies[0::2]]
        queued = [i for i, state in enumerate(states) if state is not None and state.waiters]
        waiters = dict.fromkeys(range(len(names)), 0)
        if queued:
            pipe = client.pipeline(transaction=False)
            for i in queued:
                pipe.zcard(backend.key(prefix, names[i], "queue"))
            waiters.update(zip(queued, pipe.execute(), strict=True))
        return [
            self._info(name, state, replies[2 * i + 1], waiters[i], replies[2 * i] is not None)
            for i, (name, state) in enumerate(zip(names, states, strict=True))
        ]

    def _info(
        self, name: str, state: LockState | None, pttl: int, waiters: int, present: bool
    ) -> HeldInfo | None:
        if state is None:
            if not present:
                return None
            # A value this version cannot read (written by hand, or by a
            # release of long ago) still blocks the name: shown, so it can
            # be cleared.
            unreadable = HolderInfo(
                token="", holder=UNREADABLE, ttl=pttl / 1000.0 if pttl >= 0 else None
            )
            return HeldInfo(name=name, kind=self.kind, holders=[unreadable], waiters=waiters)
        holder = HolderInfo(
            token=state.token,
            holder=state.holder,
            ttl=pttl / 1000.0 if pttl >= 0 else None,
            fencing_token=state.fencing_token,
            count=state.count,
            since=state.since,
        )
        return HeldInfo(
            name=name,
            kind=self.kind,
            holders=[holder],
            waiters=int(waiters),
            extra={"lease": state.lease, "since": state.since},
        )

    def clear(self, client: Any, prefix: str, name: str) -> int:
        """Delete the lock and wake the first waiter, as a release would."""
        return int(self.clear_many(client, prefix, [name])[0])

    def clear_many(self, client: Any, prefix: str, names: Sequence[str]) -> list[int]:
        from .scripts import CLEAR_LOCK

        def keys_of(chunk: Sequence[str]) -> list[str]:
            return CLEAR_LOCK.keys_of_each(
                {part: backend.key(prefix, name, part) for part in CLEAR_LOCK.key_names}
                for name in chunk
            )

        def signals_of(chunk: Sequence[str]) -> list[str]:
            return CLEAR_LOCK.args_of_each(
                {"sigprefix": backend.key(prefix, name, "signal:")} for name in chunk
            )

        if backend.is_cluster(client):
            # A script may not span hash slots, and redis-py refuses scripts in
            # cluster pipelines: one call per name, each routed to its slot.
            return [
                int(n)
                for name in names
                for n in CLEAR_LOCK(client, keys_of([name]), signals_of([name]))
            ]
        CLEAR_LOCK.ensure_loaded(client)
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(names), SCRIPT_BATCH):
            chunk = names[start : start + SCRIPT_BATCH]
            CLEAR_LOCK.queue(pipe, keys_of(chunk), signals_of(chunk))
        return [int(n) for reply in pipe.execute() for n in reply]


class _PermitKind:
    """Semaphores and read-write locks: a ZSET of holders scored by lease end."""

    kind = ""
    main_part = ""
    prefix = ""  # of the other parts

    def _keys(self, prefix: str, name: str) -> dict[str, str]:
        """The keys the permit scripts read, by the names of their specs."""
        return {
            "holders": backend.key(prefix, name, self.main_part),
            "queue": backend.key(prefix, name, f"{self.prefix}queue"),
            "deadlines": backend.key(prefix, name, f"{self.prefix}deadlines"),
        }

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        from .scripts import PERMIT_DESCRIBE

        keys = PERMIT_DESCRIBE.keys_of(self._keys(prefix, name))
        try:
            reply = PERMIT_DESCRIBE(client, keys, PERMIT_DESCRIBE.args_of())
        except ResponseError as exc:  # a key of another type, written by hand
            if "WRONGTYPE" not in str(exc):
                raise
            unreadable = HolderInfo(token="", holder=UNREADABLE, ttl=None)
            return HeldInfo(name=name, kind=self.kind, holders=[unreadable])
        holders = [
            replace(holder, since=_member_since(as_text(member)))
            for holder, member in zip(
                parse_holders(reply, mode_from_token=self.kind == "rwlock"),
                reply[1::2],
                strict=False,
            )
        ]
        if not holders:
            return None
        limit = parse_member(as_text(reply[1]))[2]
        mode = holders[0].mode
        return HeldInfo(
            name=name,
            kind=self.kind,
            holders=holders,
            limit=limit if limit > 0 else None,
            waiters=int(reply[0]),
            extra={"mode": mode} if mode else {},
        )

    def clear(self, client: Any, prefix: str, name: str) -> int:
        from .scripts import PERMIT_CLEAR

        sigprefix = backend.key(prefix, name, "signal:")
        keys = PERMIT_CLEAR.keys_of(self._keys(prefix, name))
        return int(PERMIT_CLEAR(client, keys, PERMIT_CLEAR.args_of(sigprefix=sigprefix)))


def _member_since(member: str) -> float | None:
    since = member.split(":", 4)[3:4]
    ms = number(since[0]) if since else None
    return ms / 1000.0 if ms is not None else None


class SemaphoreKind(_PermitKind):
    kind = "semaphore"
    main_part = "semaphore"
    prefix = "sem:"


class RWLockKind(_PermitKind):
    kind = "rwlock"
    main_part = "rwlock"
    prefix = "rw:"


#: Every kind the tools know about; primitives add theirs here.
KINDS: list[Kind] = [LockKind(), SemaphoreKind(), RWLockKind()]


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
    for raw in backend.scan(client, match, count=count):
        parsed = backend.parse_key(prefix, raw)
        if parsed is None or parsed[1] != kind.main_part:
            continue
        name = parsed[0]
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
    kind: Kind, client: Any, prefix: str, names: Sequence[str], *, batch: int = DESCRIBE_BATCH
) -> Iterator[tuple[str, int]]:
    """Clear ``names`` of ``kind`` in batches; yields ``(name, holders released)``."""
    many = getattr(kind, "clear_many", None)
    for start in range(0, len(names), batch):
        chunk = names[start : start + batch]
        counts = (
            many(client, prefix, chunk) if many else [kind.clear(client, prefix, n) for n in chunk]
        )
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
        fields = ((_text(k), number(_text(v))) for k, v in reply.items())  # by hand: left out
        found.append({k: n for k, n in fields if k in STAT_FIELDS and n is not None})
    return found


#: Counters kept per name (see ``scripts/_stats.lua`` and ``counters.py``).
STAT_FIELDS = ("acquired", "contended", "waited", "lost", "wait_ms")


def _glob_escape(text: str) -> str:
    """``text`` matched literally by SCAN's MATCH (a cache's KEY_PREFIX may hold ``*``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
