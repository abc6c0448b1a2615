"""``ReadWriteLock``: many readers or one writer, and writers are never starved.

Holders and waiters share one fair queue. A reader may join readers that hold
the lock only while no writer is queued ahead of it; a writer waits for the
holders present when it arrived to leave, and readers arriving after it wait
behind it. Timeline::

    R1, R2 hold (read)        W: acquire -> refused, queued
    R3: acquire -> refused (W is ahead), queued behind W
    R1, R2 release -> the last release wakes W -> W holds
    W releases -> wakes R3 and the readers queued with it

Each hold is a permit with its own token, lease and fencing token (taken on
first use of ``fencing_token``, or by the acquire with ``fencing=True``),
renewed by the watchdog. Acquire and release are each one ``EVALSHA``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_redislock.backend.scripts import RWLOCK_ACQUIRE
from django_redislock.backend.values import HolderInfo
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockTimeout
from django_redislock.holds import losses
from django_redislock.primitives.async_permits import AsyncPermitPrimitive
from django_redislock.primitives.base import Primitive
from django_redislock.primitives.guarded import timeout_error
from django_redislock.primitives.permits import PermitBase
from django_redislock.primitives.sync_permits import PermitPrimitive
from django_redislock.validation import check_bool

_PARTS = ("rwlock", "rw:fence", "rw:queue", "rw:deadlines")


class _RWSide(PermitBase):
    """One side (read or write) of a read-write lock, used like a ``Lock``."""

    kind = "rwlock"
    noun = "read-write lock"
    parts = _PARTS
    acquire_script = RWLOCK_ACQUIRE
    mode = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def _timeout_error(self, result: AcquireResult) -> LockTimeout:
        subject = f"Could not acquire {self.name!r} for {self.mode} in time"
        return timeout_error(subject, result, self.name)


class ReadLock(_RWSide, PermitPrimitive):
    """The shared side of a ``ReadWriteLock``: held together with other readers."""

    token_mode = "r"
    mode = "reading"

    def __enter__(self) -> ReadLock:
        super().__enter__()
        return self


class WriteLock(_RWSide, PermitPrimitive):
    """The exclusive side of a ``ReadWriteLock``: held alone."""

    token_mode = "w"
    mode = "writing"

    def __enter__(self) -> WriteLock:
        super().__enter__()
        return self


class _ReadWriteLockBase(Primitive):
    """The options shared by both sides; ``read()`` and ``write()`` build the handles."""

    kind = "rwlock"
    parts = _PARTS

    def __init__(
        self,
        name: str,
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
        )
        self._options: dict[str, Any] = {
            "timeout": timeout,
            "blocking": blocking,
            "blocking_timeout": blocking_timeout,
            "auto_renew": auto_renew,
            "using": using,
            "fencing": check_bool(fencing, "fencing", allow_none=False),
        }
        if on_lost is not None or max_hold is not None or cancel_on_loss is not False:
            # checked here, for this class's kind of hold; its handles check them again
            losses.loss_options(on_lost, max_hold, cancel_on_loss, asyncio_holds=self.asyncio_holds)
            self._options.update(on_lost=on_lost, max_hold=max_hold, cancel_on_loss=cancel_on_loss)


class ReadWriteLock(_ReadWriteLockBase):
    """Many readers or one writer on ``name``, across every process.

    ``read()`` and ``write()`` return a handle used like a ``Lock`` (``with``,
    ``acquire``, ``release``, ``extend``, ``owned``, ``fencing_token``), built
    with this lock's options. A holder is a handle in one thread; handles are
    not reentrant: a thread that holds the write side and asks for either side
    again waits for itself until its blocking timeout.

    Guarantees, as long as Redis keeps its data: a writer never overlaps any
    other holder; readers overlap each other; holds are granted in arrival
    order, except that readers arriving together are admitted together, and a
    queued writer stops later readers, so it gets in once the readers ahead of
    it leave. Every hold has a lease renewed by the watchdog.
    """

    def read(self) -> ReadLock:
        """A handle on the shared (read) side."""
        return ReadLock(self.name, **self._options)

    def write(self) -> WriteLock:
        """A handle on the exclusive (write) side."""
        return WriteLock(self.name, **self._options)

    def holders(self) -> list[HolderInfo]:
        """Every live holder, with ``mode`` ``"read"`` or ``"write"``."""
        return self.read().holders()


class AsyncReadLock(_RWSide, AsyncPermitPrimitive):
    """The shared side of an ``AsyncReadWriteLock``."""

    token_mode = "r"
    mode = "reading"

    async def __aenter__(self) -> AsyncReadLock:
        await super().__aenter__()
        return self


class AsyncWriteLock(_RWSide, AsyncPermitPrimitive):
    """The exclusive side of an ``AsyncReadWriteLock``."""

    token_mode = "w"
    mode = "writing"

    async def __aenter__(self) -> AsyncWriteLock:
        await super().__aenter__()
        return self


class AsyncReadWriteLock(_ReadWriteLockBase):
    """``ReadWriteLock`` whose handles use ``await`` and ``async with``; same guarantees.

    A holder is a handle in one asyncio task.
    """

    asyncio_holds = True

    def read(self) -> AsyncReadLock:
        """A handle on the shared (read) side."""
        return AsyncReadLock(self.name, **self._options)

    def write(self) -> AsyncWriteLock:
        """A handle on the exclusive (write) side."""
        return AsyncWriteLock(self.name, **self._options)

    async def holders(self) -> list[HolderInfo]:
        """Every live holder, with ``mode`` ``"read"`` or ``"write"``."""
        return await self.read().holders()
