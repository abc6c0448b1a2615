"""``AsyncLock``: ``Lock`` for async views and tasks, with ``async with``.

The holder is the asyncio task (``holds/registry.py``): any ``AsyncLock`` for the
name in the holding task re-enters; a task never inherits its parent's holds.
Round trips go through an asyncio mirror of the cache's connection pool, so
a waiting coroutine blocks no thread; pools with no asyncio mirror
(Sentinel, Cluster, a ``BlockingConnectionPool``) run the same calls on the
library's own daemon threads (``drivers``). Leases are renewed
by the process's watchdog, as for ``Lock``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine import drivers
from django_redislock.engine.drivers import AsyncConnection
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds import losses, tickets
from django_redislock.holds.holding import Holding
from django_redislock.holds.registry import TASK_HANDLES, current_task, forget_when_done
from django_redislock.primitives import guarded
from django_redislock.primitives.base import token_of, token_of_async
from django_redislock.primitives.detaching import (
    adopt_steps,
    adoptable,
    detach_steps,
    entered,
    entering,
    leaving,
)
from django_redislock.primitives.lock_common import LockBase
from django_redislock.validation import check_bool

logger = logging.getLogger(__name__)

_A = TypeVar("_A", bound="AsyncLock")


class AsyncLock(LockBase):
    """``Lock`` with ``await lock.acquire()`` and ``async with lock:``; same guarantees.

    With ``cancel_on_loss``, a loss cancels the holding task; leaving the
    block then raises ``LockLostError`` (``guarded.aleave``).
    """

    _handles = TASK_HANDLES
    asyncio_holds = True

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
        self._fencing = bool(check_bool(fencing, "fencing", allow_none=False))
        if on_lost is not None or max_hold is not None or cancel_on_loss is not False:
            self._loss = losses.loss_options(on_lost, max_hold, cancel_on_loss, asyncio_holds=True)
        #: per task, the holds this handle entered there (``TASK_HANDLES``)
        self._entered_by: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )
        #: per task, the holds its open ``async with`` blocks entered (``_blocks``)
        self._blocks_by: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current task's hold (``None`` when not held).

        As ``Lock.fencing_token``. When the token is not taken yet (no
        ``fencing=True``, no handoff), this property takes it with one
        *blocking* round trip on the cache's synchronous client: in a
        coroutine, ``await lock.get_fencing_token()`` instead, which does not
        block the event loop.
        """
        return token_of(self._holding(), self._fence_steps)

    async def get_fencing_token(self) -> int | None:
        """``fencing_token``, awaited: taken (when it is not yet) without
        blocking the event loop. ``None`` when the current task holds nothing;
        ``LockLostError`` when its hold is found gone."""
        return await token_of_async(self._holding(), self._fence_steps)

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock; ``False`` when it could not be taken in time."""
        return (await self._acquire(blocking, blocking_timeout)).held

    async def _acquire(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> AcquireResult:
        """``Lock._acquire`` on asyncio: the first step by ``perform_async``."""
        begun = time.monotonic()
        try:
            resolved = self._resolve()
            first = self._first_attempt(resolved, blocking, blocking_timeout, begun)
            conn = AsyncConnection(resolved.client)
            if first.take is None:
                return await drivers.run_async(self._after_first(first), conn)
            try:
                took = await drivers.perform_async(first.take, conn)
            except BaseException as error:
                return await drivers.run_async(self._after_first(first, error), conn)
            if took:
                return self._held_at_once(first)
            return await drivers.run_async(self._after_first(first), conn)
        except LockBackendError as exc:
            signals.announce_failed(self, begun, exc)
            raise

    async def release(self) -> None:
        """Release one level of the current task's hold (see ``Lock.release``)."""
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        holding.releasing = holding.depth <= 1
        conn = AsyncConnection(holding.client)
        sent = time.monotonic()
        try:
            result = await conn.run_to_the_end(
                LOCK_RELEASE, holding.keys, self._release_args(holding)
            )
        except BaseException as error:
            self._released(holding, sent, error=error)
        else:
            self._released(holding, sent, result)
        finally:
            self._handles.left(self, holding)

    async def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease from now on (see ``Lock.extend``)."""
        holding = self._holding()
        conn = AsyncConnection(holding.client if holding else None)
        await drivers.run_async(self._extend_steps(holding, seconds), conn)

    async def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        resolved = self._resolve()
        with backend.translate_errors(self.name):
            return bool(await AsyncConnection(resolved.client).call("exists", resolved.keys[0]))

    async def owned(self) -> bool:
        """Whether the current task holds the lock, according to Redis."""
        holding = self._holding()
        if holding is None:
            return False
        with backend.translate_errors(self.name):
            value = await AsyncConnection(holding.client).call("get", holding.keys[0])
        state = parse_lock_value(value)
        return state is not None and state.token == holding.token

    async def ttl(self) -> float | None:
        """Seconds left on the current lease (anyone's), or ``None`` when free."""
        resolved = self._resolve()
        with backend.translate_errors(self.name):
            remaining = await AsyncConnection(resolved.client).call("pttl", resolved.keys[0])
        return remaining / 1000.0 if remaining >= 0 else None

    # hand-over to another task or process: see primitives/detaching.py --------------------

    async def detach(self) -> str:
        """Hand the current task's hold off; a ticket for ``adopt`` (see ``Lock.detach``)."""
        holding = self._holding()
        conn = AsyncConnection(holding.client if holding else None)
        return await drivers.run_async(detach_steps(self, holding), conn)

    @classmethod
    async def adopt(cls: type[_A], ticket: str, *, auto_renew: bool | None = None) -> _A:
        """Take over the hold ``ticket`` stands for, in the current task (see
        ``Lock.adopt``); ``async with await AsyncLock.adopt(t) as lock:``
        releases it at the block's end. A ticket from a ``Lock`` works too."""
        found = tickets.loads(ticket)
        lock = cls(
            found.name, timeout=found.lease_ms / 1000, using=found.using, auto_renew=auto_renew
        )
        resolved = adoptable(lock, found)
        conn = AsyncConnection(resolved.client)
        lock._adopted = await drivers.run_async(adopt_steps(lock, found, resolved), conn)
        return lock

    def _blocks(self) -> list[Holding]:
        """The holds this handle's open ``async with`` blocks entered in this task."""
        task = current_task("AsyncLock")
        blocks = self._blocks_by.get(task)
        if blocks is None:
            forget_when_done("AsyncLock", self._blocks_by)
            blocks = self._blocks_by[task] = []
        return blocks

    async def __aenter__(self: _A) -> _A:
        blocks = self._blocks()
        if self._adopted is None or not entering(self, blocks):  # adopted: rare
            await guarded.aenter(self)
            entered(self, blocks)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not leaving(self, self._blocks()):
            await guarded.aleave(self, exc_type, exc)
