"""``AsyncPermitPrimitive``: the asyncio API of a permit primitive
(``AsyncSemaphore``, ``AsyncReadLock``, ``AsyncWriteLock``); ``PermitBase``
(``permits.py``) holds everything but the I/O.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from types import TracebackType
from typing import Any, TypeVar

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import PERMIT_DESCRIBE
from django_redislock.backend.values import HolderInfo, parse_holders
from django_redislock.engine import drivers
from django_redislock.engine.drivers import AsyncConnection
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.holds.registry import forget_when_done
from django_redislock.primitives import guarded
from django_redislock.primitives.base import token_of, token_of_async
from django_redislock.primitives.permits import PermitBase

_A = TypeVar("_A", bound="AsyncPermitPrimitive")


class AsyncPermitPrimitive(PermitBase):
    """The asyncio API of a permit primitive; a holder is the object in one task.

    Round trips go through ``AsyncLock``'s connection mirror, so a waiting
    coroutine blocks no thread; the watchdog renews the permits. With
    ``cancel_on_loss``, a loss cancels the holding task; leaving the block then
    raises ``LockLostError`` (``guarded.aleave``).
    """

    asyncio_holds = True

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._stacks: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )

    def _stack(self) -> list[Holding]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"{type(self).__name__} must be used from inside an asyncio task.")
        stack = self._stacks.get(task)
        if stack is None or (stack and stack[0].pid != current_pid()):
            if stack is None:
                forget_when_done(type(self).__name__, self._stacks)
            stack = self._stacks[task] = []
        return stack

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of this task's latest permit (``None`` when none).

        As ``Semaphore.fencing_token``. When the token is not taken yet (no
        ``fencing=True``), this property takes it with one *blocking* round
        trip on the cache's synchronous client: in a coroutine, ``await
        sem.get_fencing_token()`` instead, which does not block the event loop.
        """
        return token_of(self._latest(), self._fence_steps)

    async def get_fencing_token(self) -> int | None:
        """``fencing_token``, awaited: taken (when it is not yet) without
        blocking the event loop. ``None`` when this task holds no permit;
        ``LockLostError`` when its permit is found gone."""
        return await token_of_async(self._latest(), self._fence_steps)

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take a permit; ``False`` when none could be had in time."""
        return (await self._acquire(blocking, blocking_timeout)).held

    async def _acquire(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> AcquireResult:
        begun = time.monotonic()
        try:
            conn = AsyncConnection(self._resolve().client)
            return await drivers.run_async(self._acquire_steps(blocking, blocking_timeout), conn)
        except LockBackendError as exc:
            signals.announce_failed(self, begun, exc)
            raise

    async def release(self) -> None:
        """Return this holder's latest permit (see ``Semaphore.release``)."""

        stack = self._stack()
        if not stack:
            raise self._not_owned()
        holding = stack.pop()
        holding.releasing = True
        keys, args = self._release_call(holding)
        sent = time.monotonic()
        try:
            conn = AsyncConnection(holding.client)
            result = await conn.run_to_the_end(self.release_script, keys, args)
        except BaseException as error:
            self._released(holding, sent, error=error)
        else:
            self._released(holding, sent, result)

    async def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease of this holder's latest permit from now on
        (for the watchdog's renewals too; see ``Lock.extend``)."""
        holding = self._latest()
        conn = AsyncConnection(holding.client if holding else None)
        await drivers.run_async(self._extend_steps(holding, seconds), conn)

    async def owned(self) -> bool:
        """Whether this holder's latest permit is live, according to Redis."""
        return bool(self._stack()) and self._owns(await self.holders())

    async def __aenter__(self: _A) -> _A:
        return await guarded.aenter(self)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await guarded.aleave(self, exc_type, exc)

    async def holders(self) -> list[HolderInfo]:
        """Every live holder (see ``Semaphore.holders``)."""

        client, keys = self._describe_keys()
        with backend.translate_errors(self.name):
            reply = await AsyncConnection(client).send(
                PERMIT_DESCRIBE, keys, PERMIT_DESCRIBE.args_of()
            )
        return parse_holders(reply, mode_from_token=bool(self.token_mode))
