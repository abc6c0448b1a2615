"""How each kind of held primitive is read and cleared in Redis, for operators.

A ``Kind`` names the key part that exists exactly while the primitive is held
(its *main part*), describes one name (or many, pipelined) from its keys as a
``HeldInfo``, and clears it. ``inspection`` runs them over every name held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from django_redislock.backend import client as backend
from django_redislock.backend import family
from django_redislock.backend.values import (
    HolderInfo,
    LockState,
    number,
    parse_holders,
    parse_lock_value,
    parse_member,
)
from django_redislock.primitives.leadership_common import LEADER_PREFIX


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


class Kind(Protocol):
    kind: str
    main_part: str

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        """Everything known about ``name``; ``None`` when it is not held."""

    def clear(
        self, client: Any, prefix: str, name: str, *, confirmed: HeldInfo | None = None
    ) -> int:
        """Release every holder of ``name``; returns how many were released.

        Holders are not told directly: their next renewal or release finds the
        lease gone and reports ``LockLostError`` / ``lock_lost``.

        With ``confirmed`` (the name as an operator was shown it), only if
        exactly its holders still hold it, compared in the script that clears:
        a name that changed hands after the operator's last read would
        otherwise be cleared from under a holder nobody was shown. Else
        nothing changes and the answer is ``CHANGED_HANDS``, or 0 when nobody
        holds it any more.
        """


#: What a clear confirmed for some holders answers when others hold the name.
CHANGED_HANDS = -1
#: The clear scripts' ``confirmed`` when nobody confirmed anyone: whoever holds it.
ANYONE = "*"


def confirmed_tokens(confirmed: HeldInfo | None) -> str:
    """The clear scripts' ``confirmed``: the holders' tokens, comma-separated."""
    return ANYONE if confirmed is None else ",".join(h.token for h in confirmed.holders)


#: Who holds a name whose keys cannot be read (``unreadable``).
UNREADABLE = "unknown (a value this version cannot read; clear it to free the name)"


def unreadable(name: str, kind: str, ttl: float | None = None, waiters: int = 0) -> HeldInfo:
    """A name whose keys this version cannot read (written by hand, by a
    release of long ago, or of another type): it still blocks the name, so it
    is shown, and can be cleared."""
    holder = HolderInfo(token="", holder=UNREADABLE, ttl=ttl)
    return HeldInfo(name=name, kind=kind, holders=[holder], waiters=waiters)


#: Names one operator script call reads or clears: about 0.1 ms of server time,
#: so a listing or a mass clear never blocks other clients noticeably.
SCRIPT_BATCH = 100


class LockKind:
    kind = "lock"
    main_part = "lock"
    prefix = ""  # of the queue parts

    def owns(self, name: str) -> bool:
        """Whether a ``lock`` key of ``name`` is this kind's: a leadership's
        lock (``leader:<name>``) is shown as a leadership, not as a lock."""
        return not name.startswith(LEADER_PREFIX)

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        return self.describe_many(client, prefix, [name])[0]

    def describe_many(
        self, client: Any, prefix: str, names: Sequence[str]
    ) -> list[HeldInfo | None]:
        """``describe`` for many names: GET and PTTL of every lock in one script
        call per batch (pipelined per name on Cluster), then ZCARD only for the
        few locks whose value says waiters may be queued. Each read is O(1) and
        a batch is a few hundred names, so no command blocks the server."""
        from django_redislock.backend.scripts import INSPECT_LOCKS

        owned = [self.owns(name) for name in names]
        if not all(owned):  # another kind's names: described by that kind
            found = iter(self.describe_many(client, prefix, [n for n in names if self.owns(n)]))
            return [next(found) if mine else None for mine in owned]
        keys = [backend.key(prefix, name, "lock") for name in names]
        if backend.is_cluster(client):
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            # a key of another type fails its GET only (read as unreadable)
            replies: list[Any] = [
                "" if isinstance(reply, family.response_errors()) else reply
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
            return unreadable(name, self.kind, pttl / 1000.0 if pttl >= 0 else None, waiters)
        holder = HolderInfo(
            token=state.token,
            holder=state.holder,
            ttl=pttl / 1000.0 if pttl >= 0 else None,
            fencing_token=state.fencing_token or None,  # 0: not taken yet (taken on use)
            count=state.count,
            since=state.since,
            lease=state.lease,
            handed_over=state.handed_over,
            detached_since=state.detached_since,
        )
        return HeldInfo(
            name=name,
            kind=self.kind,
            holders=[holder],
            waiters=int(waiters),
            extra={"lease": state.lease, "since": state.since},
        )

    def clear(
        self, client: Any, prefix: str, name: str, *, confirmed: HeldInfo | None = None
    ) -> int:
        """Delete the lock and wake the first waiter, as a release would."""
        held_by = None if confirmed is None else {name: confirmed}
        return int(self.clear_many(client, prefix, [name], confirmed=held_by)[0])

    def clear_many(
        self,
        client: Any,
        prefix: str,
        names: Sequence[str],
        *,
        confirmed: Mapping[str, HeldInfo] | None = None,
    ) -> list[int]:
        """``clear`` for many names; ``confirmed`` holds each name's, if any."""
        from django_redislock.backend.scripts import CLEAR_LOCK

        def keys_of(chunk: Sequence[str]) -> list[str]:
            return CLEAR_LOCK.keys_of_each(
                {part: backend.key(prefix, name, part) for part in CLEAR_LOCK.key_names}
                for name in chunk
            )

        def args_of(chunk: Sequence[str]) -> list[str]:
            return CLEAR_LOCK.args_of_each(
                {"confirmed": confirmed_tokens(None if confirmed is None else confirmed[name])}
                for name in chunk
            )

        if backend.is_cluster(client):
            # A script may not span hash slots, and redis-py refuses scripts in
            # cluster pipelines: one call per name, each routed to its slot.
            return [
                int(n)
                for name in names
                for n in CLEAR_LOCK(client, keys_of([name]), args_of([name]))
            ]
        CLEAR_LOCK.ensure_loaded(client)
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(names), SCRIPT_BATCH):
            chunk = names[start : start + SCRIPT_BATCH]
            CLEAR_LOCK.queue(pipe, keys_of(chunk), args_of(chunk))
        return [int(n) for reply in pipe.execute() for n in reply]


class LeadershipKind(LockKind):
    """A ``Leadership`` (``primitives/leadership.py``): the lock ``leader:<name>``.
    Its holder is the leader, ``since`` when it was elected, and its queued
    waiters are the standbys."""

    kind = "leadership"

    def owns(self, name: str) -> bool:
        return name.startswith(LEADER_PREFIX)


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
        from django_redislock.backend.scripts import PERMIT_DESCRIBE

        keys = PERMIT_DESCRIBE.keys_of(self._keys(prefix, name))
        try:
            reply = PERMIT_DESCRIBE(client, keys, PERMIT_DESCRIBE.args_of())
        except family.response_errors() as exc:  # a key of another type, written by hand
            if "WRONGTYPE" not in str(exc):
                raise
            return unreadable(name, self.kind)
        holders = [
            replace(holder, since=_member_since(backend.as_text(member)))
            for holder, member in zip(
                parse_holders(reply, mode_from_token=self.kind == "rwlock"),
                reply[1::2],
                strict=False,
            )
        ]
        if not holders:
            return None
        limit = parse_member(backend.as_text(reply[1]))[2]
        mode = holders[0].mode
        return HeldInfo(
            name=name,
            kind=self.kind,
            holders=holders,
            limit=limit if limit > 0 else None,
            waiters=int(reply[0]),
            extra={"mode": mode} if mode else {},
        )

    def clear(
        self, client: Any, prefix: str, name: str, *, confirmed: HeldInfo | None = None
    ) -> int:
        from django_redislock.backend.scripts import PERMIT_CLEAR

        keys = PERMIT_CLEAR.keys_of(self._keys(prefix, name))
        args = PERMIT_CLEAR.args_of(
            sigprefix=backend.key(prefix, name, "signal:"),
            confirmed=confirmed_tokens(confirmed),
        )
        return int(PERMIT_CLEAR(client, keys, args))


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
