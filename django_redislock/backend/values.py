"""What the scripts store in Redis, read back: lock values and permit holders.

Shared by the primitives (``owned()``, ``holders()``) and by the operator
tools (``inspection``, the command, the dashboard), so neither imports the
other. The formats are written by ``backend/scripts/_lock_value.lua`` and
``backend/scripts/_permits.lua``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_redislock.backend.client import as_text


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


#: Ends the stored holder of a hold that began as a handoff (``_handoff.lua``).
HANDED_MARK = "\x1ehandoff"


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
    )


def number(text: str) -> int | None:
    """A count, fence or time the scripts wrote (ASCII digits, within 64 bits);
    ``None`` for anything else, which a value written by hand may hold."""
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    return None


@dataclass(frozen=True)
class HolderInfo:
    """One holder of a primitive."""

    token: str
    holder: str  # host:pid:thread, as the holder described itself
    ttl: float | None  # seconds left on its lease
    fencing_token: int | None = None
    count: int = 1  # reentrant depth
    mode: str | None = None  # "read" / "write" for read-write locks
    since: float | None = None  # the holder's wall clock at acquire, in seconds
    lease: float | None = None  # seconds, as last set (Lock only)
    handed_over: bool = False  # the hold began as a handoff (Lock only)


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
