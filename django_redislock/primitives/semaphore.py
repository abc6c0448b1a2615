"""``Semaphore``: at most ``limit`` holders of a name, served in arrival order.

Round trips: an acquire that gets a permit is one ``EVALSHA``; a release is
one. A waiter adds one ``BLPOP`` per wake-up and one re-check, like ``Lock``.
The fencing token costs one ``EVALSHA`` on first use, or none when asked for
up front (``fencing=True``: the acquire takes it).

Unlike the textbook sorted-set semaphore (a pipeline of ``ZREMRANGEBYSCORE``,
``ZADD``, ``ZRANK`` and a compensating ``ZREM``, scored by the client's
clock), expiry and arrival order here are read from the Redis server's clock
inside the script, so a web node whose clock runs minutes ahead or behind can
neither steal a permit nor make one outlive its lease.

Each permit is its own holding with its own token, lease and fencing token
(``fencing_token``, taken on first use unless the acquire took it);
the watchdog renews them all. A thread that acquires twice holds
two permits (as with ``threading.Semaphore``); ``release`` returns the latest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_redislock.backend.scripts import SEMAPHORE_ACQUIRE
from django_redislock.engine.steps import LIMIT_MISMATCH
from django_redislock.primitives.async_permits import AsyncPermitPrimitive
from django_redislock.primitives.permits import PermitBase
from django_redislock.primitives.sync_permits import PermitPrimitive
from django_redislock.validation import fixed

#: The largest limit: Lua's numbers are doubles, exact up to 2**53; past it two
#: limits could compare equal, and a huge one would read as infinity.
MAX_LIMIT = 2**53


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(
            f"limit must be an int of at least 1, got {limit!r} ({type(limit).__name__})."
        )
    if limit > MAX_LIMIT:
        raise ValueError(
            f"limit must be an int of at most 2**53, got 2**{limit.bit_length() - 1} or more."
        )
    return limit


class SemaphoreBase(PermitBase):
    """What ``Semaphore`` and ``AsyncSemaphore`` share: the limit, keys and scripts."""

    kind = "semaphore"
    parts = ("semaphore", "sem:fence", "sem:queue", "sem:deadlines")
    acquire_script = SEMAPHORE_ACQUIRE

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
        fencing: bool = False,
        on_lost: Callable[[Any], object] | None = None,
        max_hold: float | None = None,
        cancel_on_loss: bool = False,
    ) -> None:
        super().__init__(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
            fencing=fencing,
            on_lost=on_lost,
            max_hold=max_hold,
            cancel_on_loss=cancel_on_loss,
        )
        self._limit = check_limit(limit)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} limit={self.limit}>"

    #: How many holders at once; every user of the name must agree on it.
    limit: int = fixed("limit")

    def _resolve_options(self) -> tuple[object, ...]:
        return (*super()._resolve_options(), self._limit)

    def _member_limit(self) -> int:
        return self._limit

    def _on_status(self, status: int, value: int) -> None:
        if status == LIMIT_MISMATCH:
            raise ValueError(
                f"Semaphore {self.name!r} is in use with limit={value}, "
                f"but this one was created with limit={self.limit}; "
                f"every user of a name must pass the same limit."
            )
        super()._on_status(status, value)


class Semaphore(SemaphoreBase, PermitPrimitive):
    """At most ``limit`` holders of ``name`` at once, across every process.

    Guarantees, as long as Redis keeps its data: never more than ``limit``
    live permits; permits go to waiters in arrival order, ordered and expired
    by the Redis server's clock (client clocks are never consulted); each
    permit has a lease (``timeout``), so a holder that died gives its permit
    back when the lease ends, while the watchdog renews live holders
    (``auto_renew``). A permit lost anyway is reported (``lock_lost``,
    ``LockLostError``). Every permit's fencing token is greater than all
    earlier ones for the name: taken on first read of ``fencing_token`` (one
    owner-checked round trip; a lost permit raises ``LockLostError``, never
    gets a token), or by the acquire itself with ``fencing=True``.

    Every user of a name must agree on ``limit``: acquiring with a limit that
    differs from the one in use raises ``ValueError``.
    """

    def __enter__(self) -> Semaphore:
        super().__enter__()
        return self


class AsyncSemaphore(SemaphoreBase, AsyncPermitPrimitive):
    """``Semaphore`` with ``await sem.acquire()`` and ``async with sem:``; same guarantees.

    A holder is the object in one asyncio task.
    """

    async def __aenter__(self) -> AsyncSemaphore:
        await super().__aenter__()
        return self
