"""Read-only views of held primitives, and clearing them, for operators.

Each kind of primitive contributes a ``Kind``: the key part that exists exactly
while it is held (its *main part*), how to describe one name from its keys,
and how to clear it. ``manage.py locks`` and the admin dashboard go through
this module only, so a new primitive shows up in both by adding a ``Kind``.

Listing uses SCAN (never KEYS) with ``MATCH <prefix>:{*}:<main part>``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import backend


@dataclass(frozen=True)
class HolderInfo:
    """One holder of a primitive."""

    token: str
    holder: str  # host:pid:thread, as the holder described itself
    ttl: float | None  # seconds left on its lease
    fencing_token: int | None = None
    count: int = 1  # reentrant depth
    mode: str | None = None  # "read" / "write" for read-write locks


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

    def clear(self, client: Any, prefix: str, name: str) -> int:
        """Release every holder of ``name``; returns how many were released.

        Holders are not told directly: their next renewal or release finds the
        lease gone and reports ``LockLostError`` / ``lock_lost``.
        """


def _waiters(client: Any, prefix: str, name: str) -> int:
    return int(client.zcard(backend.key(prefix, name, "queue")))


class LockKind:
    kind = "lock"
    main_part = "lock"

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        from .locks import parse_lock_value

        key = backend.key(prefix, name, "lock")
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        pipe.zcard(backend.key(prefix, name, "queue"))
        value, pttl, waiters = pipe.execute()
        state = parse_lock_value(value)
        if state is None:
            return None
        holder = HolderInfo(
            token=state.token,
            holder=state.holder,
            ttl=pttl / 1000.0 if pttl >= 0 else None,
            fencing_token=state.fencing_token,
            count=state.count,
        )
        return HeldInfo(
            name=name,
            kind=self.kind,
            holders=[holder],
            waiters=int(waiters),
            extra={"lease": state.lease, "since": state.since},
        )

    def clear(self, client: Any, prefix: str, name: str) -> int:
        return int(client.delete(backend.key(prefix, name, "lock")))


class _PermitKind:
    """Semaphores and read-write locks: a ZSET of holders scored by lease end."""

    kind = ""
    main_part = ""
    prefix = ""  # of the other parts

    def _keys(self, prefix: str, name: str) -> list[str]:
        return [
            backend.key(prefix, name, self.main_part),
            backend.key(prefix, name, f"{self.prefix}queue"),
            backend.key(prefix, name, f"{self.prefix}deadlines"),
        ]

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        from .scripts import PERMIT_DESCRIBE
        from .semaphores import as_text, parse_holders, parse_member

        reply = PERMIT_DESCRIBE(client, self._keys(prefix, name)[:2], [])
        holders = parse_holders(reply, mode_from_token=self.kind == "rwlock")
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
        return int(PERMIT_CLEAR(client, self._keys(prefix, name), [sigprefix]))


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
    match = f"{prefix}:{{*}}:{kind.main_part}"
    for raw in backend.scan(client, match, count=count):
        parsed = backend.parse_key(prefix, raw)
        if parsed is None or parsed[1] != kind.main_part:
            continue
        name = parsed[0]
        if pattern is None or fnmatch.fnmatchcase(name, pattern):
            yield name


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
        for name in sorted(set(held_names(client, prefix, kind, pattern))):
            info = kind.describe(client, prefix, name)
            if info is not None:
                found.append(info)
    found.sort(key=lambda info: (info.name, info.kind))
    return found


def describe(client: Any, prefix: str, name: str) -> list[HeldInfo]:
    """What every kind knows about ``name`` (usually one entry, or none)."""
    return [info for kind in KINDS if (info := kind.describe(client, prefix, name)) is not None]


def clear(client: Any, prefix: str, name: str) -> int:
    """Release every holder of ``name`` of every kind; returns how many were released."""
    return sum(kind.clear(client, prefix, name) for kind in KINDS)
