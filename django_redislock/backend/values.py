"""What the scripts store in Redis, read back: lock values and permit holders.

Shared by the primitives (``owned()``, ``holders()``) and by the operator
tools (``inspection``, the command, the dashboard), so neither imports the
other. The formats are written by ``backend/scripts/_lock_value.lua`` and
``backend/scripts/_permits.lua``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django_redislock.backend.client import as_text
from django_redislock.context import SEPARATOR


@dataclass(frozen=True)
class LockState:
    """A held lock as stored in Redis (see ``backend/scripts/_lock_value.lua``)."""

    token: str
    waiters: bool
    count: int
    fencing_token: int
    lease: float
    since: float
    holder: str
    #: The hold began as a handoff from the previous holder (``_handoff.lua``).
    handed_over: bool = False
    #: The server's clock (seconds) when the hold was detached, while it
    #: waits for its adopter (``lock_detach.lua``); ``None`` otherwise.
    detached_since: float | None = None


#: Ends the stored holder of a hold that began as a handoff (``_handoff.lua``).
HANDED_MARK = "\x1ehandoff"
#: Ends the stored holder of a detached hold, then the detach's server ms
#: (``lock_detach.lua``).
DETACHED_MARK = "\x1edetached@"


def split_detached(holder: str) -> tuple[str, float | None]:
    """A stored holder without its detached mark, and the detach's server
    clock in seconds (``None`` when the hold is not detached)."""
    at = holder.rfind(DETACHED_MARK)
    if at < 0:
        return holder, None
    ms = number(holder[at + len(DETACHED_MARK) :])
    return (holder, None) if ms is None else (holder[:at], ms / 1000.0)


def parse_lock_value(value: bytes | str | None) -> LockState | None:
    """Decode a lock key's value; ``None`` for a missing or foreign value."""
    if value is None:
        return None
    text = as_text(value)
    parts = text.split(":", 6)
    if len(parts) != 7:
        return None
    token, waiters, count, fence, lease, since, holder = parts
    numbers = [n for text in (count, fence, lease, since) if (n := number(text)) is not None]
    if len(numbers) != 4:
        return None
    holder, detached_since = split_detached(holder)
    handed_over = holder.endswith(HANDED_MARK)
    if handed_over:
        holder = holder[: -len(HANDED_MARK)]
    return LockState(
        token=token,
        waiters=waiters == "1",
        count=numbers[0],
        fencing_token=numbers[1],
        lease=numbers[2] / 1000.0,
        since=numbers[3] / 1000.0,
        holder=holder,
        handed_over=handed_over,
        detached_since=detached_since,
    )


def number(text: str) -> int | None:
    """A count, fence or time the scripts wrote (ASCII digits, within 64 bits);
    ``None`` for anything else, which a value written by hand may hold."""
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    return None


@dataclass(frozen=True)
class HolderInfo:
    """One holder of a primitive.

    ``host``, ``pid``, ``thread`` and ``runs`` read the parts of ``holder``,
    the description the holder stored (``host:pid:thread``, then
    ``" | "`` and what it runs when known; see ``context.py``).
    """

    token: str
    holder: str  # host:pid:thread, as the holder described itself
    ttl: float | None  # seconds left on its lease
    fencing_token: int | None = None
    count: int = 1  # reentrant depth
    mode: str | None = None  # "read" / "write" for read-write locks
    since: float | None = None  # the holder's wall clock at acquire, in seconds
    lease: float | None = None  # seconds, as last set (Lock only)
    handed_over: bool = False  # the hold began as a handoff (Lock only)
    #: server clock (seconds) of its detach, while it waits for an adopter (Lock only)
    detached_since: float | None = None

    def _ident(self) -> list[str]:
        who = self.holder.partition(SEPARATOR)[0]
        return [*who.split(":", 2), "", ""][:3]

    @property
    def host(self) -> str:
        return self._ident()[0]

    @property
    def pid(self) -> int | None:
        """The holder's process id; ``None`` when its description has none."""
        return number(self._ident()[1])

    @property
    def thread(self) -> str:
        """The holder's thread name (a sync holder) or thread running its task."""
        return self._ident()[2]

    @property
    def runs(self) -> str:
        """What the holder runs (``POST /buy/42/``, a task, a command); ``""`` when unknown."""
        return self.holder.partition(SEPARATOR)[2]

    def held_for(self, now: float | None = None) -> float | None:
        """Seconds since the holder acquired, by ``now`` (``time.time()``) less
        its own clock at acquire (``since``): off by the skew between the two
        clocks, never below 0; ``None`` when ``since`` is unknown."""
        if self.since is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.since)


def parse_holders(reply: list[Any], mode_from_token: bool = False) -> list[HolderInfo]:
    """Decode the holder rows of ``permit_describe.lua`` (member, ms left, ...)."""
    found = []
    for i in range(1, len(reply) - 1, 2):
        token, fence, _, holder = parse_member(as_text(reply[i]))
        mode = None
        if mode_from_token:
            mode = "write" if token.startswith("w") else "read"
        found.append(
            HolderInfo(
                token=token,
                holder=holder,
                ttl=int(reply[i + 1]) / 1000.0,
                fencing_token=number(fence) or None,  # 0: not taken yet (taken on use)
                mode=mode,
            )
        )
    return found


def parse_member(member: str) -> tuple[str, str, int, str]:
    """``(token, fence, limit, holder)`` of a holder member (see ``_permits.lua``)."""
    token, fence, limit, _, holder = [*member.split(":", 4), "", "", "", ""][:5]
    return token, fence, number(limit) or 0, holder


def lock_holder(value: bytes | str | None, ttl_ms: int) -> HolderInfo | None:
    """The holder of a lock whose value is ``value`` and whose lease has
    ``ttl_ms`` left (``lock_acquire.lua``'s refusal); ``None`` for no value.
    The token is shortened to 8 characters, as operators see it (enough to
    tell holders apart, too short to act as the holder)."""
    state = parse_lock_value(value)
    if state is None:
        return None
    return HolderInfo(
        token=state.token[:8],
        holder=state.holder,
        ttl=ttl_ms / 1000.0 if ttl_ms > 0 else None,
        fencing_token=state.fencing_token or None,
        count=state.count,
        since=state.since or None,
        lease=state.lease,
        handed_over=state.handed_over,
    )


def member_holder(member: bytes | str | None, ttl_ms: int) -> HolderInfo | None:
    """The permit holder whose member is ``member`` (see ``_permits.lua``),
    its lease ending in ``ttl_ms``; the mode from a read-write token's first
    character, the token shortened as in ``lock_holder``."""
    if member is None:
        return None
    parts = as_text(member).split(":", 4)
    if len(parts) != 5:
        return None
    token, fence, limit, _, holder = parts
    since = number(parts[3])
    mode = {"r": "read", "w": "write"}.get(token[:1]) if not number(limit) else None
    return HolderInfo(
        token=token[:8],
        holder=holder,
        ttl=ttl_ms / 1000.0 if ttl_ms > 0 else None,
        fencing_token=number(fence) or None,
        mode=mode,
        since=since / 1000.0 if since else None,
    )


def holder_phrase(holder: HolderInfo, held_for: float | None = None) -> str:
    """``"web-3 pid 4121 (POST /buy/42/) for 12.4 s"``: who holds a name, for
    error messages and answers (the thread only when what it runs is unknown;
    the stored description as it is when it names no pid)."""
    pid = holder.pid
    if pid is None:
        who = holder.holder or "an unknown holder"
    else:
        who = f"{holder.host} pid {pid}"
        who += f" ({holder.runs})" if holder.runs else f" thread {holder.thread}"
    return who if held_for is None else f"{who} for {held_for:.1f} s"


def holder_json(holder: HolderInfo) -> dict[str, Any]:
    """Who holds a name, as a 423's JSON says it: ``host``, ``pid``,
    ``thread``, ``runs`` and ``since`` (ISO 8601, UTC, by the holder's clock;
    ``None`` when unknown). No token: an answer never carries one."""
    since = None
    if holder.since is not None:
        stamp = datetime.fromtimestamp(holder.since, tz=timezone.utc)
        since = stamp.isoformat(timespec="milliseconds")
    return {
        "host": holder.host,
        "pid": holder.pid,
        "thread": holder.thread,
        "runs": holder.runs,
        "since": since.replace("+00:00", "Z") if since else None,
    }
