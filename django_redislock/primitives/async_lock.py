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
from typing import Any

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine import drivers
from django_redislock.engine.drivers import AsyncConnection
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.holds.registry import Registry, current_task, forget_when_done, task_registry
from django_redislock.primitives.base import AsyncPrimitive, token_of, token_of_async
from django_redislock.primitives.lock_common import LockBase
from django_redislock.validation import check_bool

logger = logging.getLogger(__name__)


class AsyncLock(LockBase, AsyncPrimitive):
    """``Lock`` with ``await lock.acquire()`` and ``async with lock:``; same guarantees."""

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
        self._entered_by: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )

    def _entered(self) -> list[Holding]:
        task = current_task("AsyncLock")
        entered = self._entered_by.get(task)
        if entered is None or (entered and entered[0].pid != current_pid()):
            if entered is None:
                forget_when_done("AsyncLock", self._entered_by)
            entered = self._entered_by[task] = []
        return entered

    def _registry(self) -> Registry[Holding]:
        return task_registry("AsyncLock")

    def _holding(self) -> Holding | None:
        """The hold this handle's release, extend and ``owned`` apply to."""
        return self._current(None)

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
        begun = time.monotonic()
        try:
            resolved = self._resolve()
            steps = self._acquire_steps(resolved, blocking, blocking_timeout)
            return await drivers.run_async(steps, AsyncConnection(resolved.client))
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
            try:
                with backend.translate_errors(self.name):
                    result = await conn.run_to_the_end(
                        LOCK_RELEASE, holding.keys, self._release_args(holding)
                    )
            except LockBackendError as exc:
                error = self._unreachable(holding, exc, sent, "released it")
                self._release_failed(holding)
                raise error from error.__cause__
            except BaseException:
                self._release_failed(holding)
                raise
            self._after_release(holding, result)
        finally:
            self._left(holding)

    async def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease from now on (see ``Lock.extend``)."""
        holding = self._holding()
        conn = AsyncConnection(holding.client if holding else None)
        await drivers.run_async(self._extend_steps(holding, seconds), conn)

    async def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        with backend.translate_errors(self.name):
            return bool(await AsyncConnection(self._client(settings)).call("exists", keys[0]))

    async def owned(self) -> bool:
        """Whether the current task holds the lock, according to Redis."""
        holding = self._holding()
        if holding is None:
            return False
        keys, _ = self._key_set(self._prefix(self._settings()))
        with backend.translate_errors(self.name):
            value = await AsyncConnection(holding.client).call("get", keys[0])
        state = parse_lock_value(value)
        return state is not None and state.token == holding.token

    async def ttl(self) -> float | None:
        """Seconds left on the current lease (anyone's), or ``None`` when free."""
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        with backend.translate_errors(self.name):
            remaining = await AsyncConnection(self._client(settings)).call("pttl", keys[0])
        return remaining / 1000.0 if remaining >= 0 else None
