"""``AsyncLock``: ``Lock`` for async views and tasks, with ``async with``.

The holder is the asyncio task (``holders.py``): any ``AsyncLock`` for the
name in the holding task re-enters; a task never inherits its parent's holds.
Round trips go through an asyncio mirror of the cache's connection pool, so
a waiting coroutine blocks no thread; topologies with no asyncio mirror
(Sentinel, Cluster) run the same calls in a worker thread. Leases are renewed
by the process's one watchdog thread, as for ``Lock``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any

from . import backend
from .base import (
    WAITER_GRACE_MS,
    WAKE_UP,
    AsyncPrimitive,
    Holding,
    check_lease,
    current_pid,
    handoff_fresh,
    new_token,
    wait_seconds,
)
from .holders import Registry, current_task, task_registry
from .locks import (
    ACQUIRED,
    GONE_AT_REENTRY,
    NOT_OURS,
    LockBase,
    acquire_reply,
    parse_lock_value,
)
from .scripts import LOCK_ACQUIRE, LOCK_CANCEL, LOCK_EXTEND, LOCK_RELEASE, Script
from .watchdog import watchdog

logger = logging.getLogger(__name__)


def _cancel_requests() -> int:
    """How many cancellations of the current task are pending (0 before Python 3.11)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


class AsyncConnection:
    """Run scripts and commands on asyncio, natively or in a worker thread."""

    def __init__(self, sync_client: Any) -> None:
        self.sync = sync_client
        self.aio = backend.get_async_client(sync_client)
        self._cancels_before = _cancel_requests()

    async def run(self, script: Script, keys: Sequence[str | bytes], args: list[Any]) -> Any:
        if self.aio is not None:
            return await script.run_async(self.aio, keys, args)
        return await asyncio.to_thread(script, self.sync, keys, args)

    async def wait_signal(self, key: str | bytes, timeout: float) -> tuple[bytes, bytes] | None:
        """``BLPOP`` one waiter's signal list: ``(key, value)``, or ``None`` in time.

        redis.asyncio writes each command under ``asyncio.wait_for``, which
        before Python 3.12 returns normally when the task is cancelled just as
        the write completes (CPython gh-86296): a waiter would then carry on
        waiting until its ``blocking_timeout``. Python 3.11 still counts the
        request (``Task.cancelling``, compared with its count when this
        connection was made), so it is honoured here after the wait; on
        Python 3.10 the lost cancellation cannot be seen.
        """
        signal = await self.call("blpop", [key], timeout=timeout)
        if _cancel_requests() > self._cancels_before:
            raise asyncio.CancelledError
        return None if signal is None else (signal[0], signal[1])

    async def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if self.aio is not None:
            return await getattr(self.aio, command)(*args, **kwargs)
        return await asyncio.to_thread(getattr(self.sync, command), *args, **kwargs)


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
    ) -> None:
        super().__init__(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
        )
        self._entered_by: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )

    def _entered(self) -> list[Holding]:
        task = current_task("AsyncLock")
        entered = self._entered_by.get(task)
        if entered is None or (entered and entered[0].pid != current_pid()):
            entered = self._entered_by[task] = []
        return entered

    def _registry(self) -> Registry[Holding]:
        return task_registry("AsyncLock")

    def _holding(self) -> Holding | None:
        """The hold this handle's release, extend and ``owned`` apply to."""
        return self._current(None)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current task's hold (``None`` when not held)."""
        holding = self._holding()
        return holding.fencing_token if holding is not None else None

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock; ``False`` when it could not be taken in time."""
        return await self._acquire(blocking, blocking_timeout) is None

    async def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> int | None:
        settings = self._settings()
        sync_client, chunk = self._client_and_chunk(settings)
        conn = AsyncConnection(sync_client)
        keys, sigprefix = self._key_set(settings.key_prefix)
        lease = self._lease(settings)
        lease_ms = int(lease * 1000)
        hold_key = self._hold_key(self.using or settings.cache, keys[0])
        holding = self._reentry(hold_key)
        if holding is not None:
            args = self._acquire_args(
                holding.token, int(holding.lease * 1000), "nest", 0, sigprefix,
                settings.stats_ttl_ms,
            )  # fmt: skip
            with backend.translate_errors(self.name):
                status, _ = acquire_reply(await conn.run(LOCK_ACQUIRE, keys, args))
            if status != NOT_OURS:
                holding.depth += 1
                self._took(hold_key, holding)
                return None
            self._supersede(self._registry(), hold_key, holding, GONE_AT_REENTRY)

        may_wait, budget = self._wait_budget(blocking, blocking_timeout, settings)
        token = new_token()
        begun = time.monotonic()
        deadline = None if budget is None else begun + budget
        waiter_ttl_ms = int(chunk * 1000) + WAITER_GRACE_MS
        mode = "wait" if may_wait else "try"
        auto_renew = self._auto_renew(settings)
        grant_ms = self._grant_ms(lease_ms, waiter_ttl_ms)
        args = self._acquire_args(
            token, lease_ms, mode, waiter_ttl_ms, sigprefix, settings.stats_ttl_ms, grant_ms
        )
        release_keys = self._release_keys(keys)
        release_args = self._release_args(token, sigprefix, settings.stats_ttl_ms)
        signal_key = sigprefix + token
        queued = False
        handed = False
        with backend.translate_errors(self.name):
            try:
                while True:
                    started = time.monotonic()
                    status, value = acquire_reply(await conn.run(LOCK_ACQUIRE, keys, args))
                    if status == ACQUIRED:
                        break
                    queued = may_wait
                    if not may_wait or (deadline is not None and time.monotonic() >= deadline):
                        if queued:
                            await conn.run(LOCK_CANCEL, release_keys, release_args)
                        self._announce_contended(begun)
                        return int(value)
                    signal = await conn.wait_signal(
                        signal_key, wait_seconds(value, chunk, deadline)
                    )
                    if (
                        signal is not None
                        and signal[1] not in WAKE_UP
                        and handoff_fresh(started, grant_ms / 1000 if auto_renew else 0.0)
                    ):  # handed over while waiting: see wait_turn
                        handed, value = True, int(signal[1])
                        break
                    self._waited(args, begun)
            except BaseException:
                await asyncio.shield(self._clean_up(conn, release_keys, release_args))
                raise
        holding = self._new_holding(
            token,
            sync_client,
            lease,
            started,
            value,
            release_keys,
            sigprefix,
            settings.stats_ttl_ms,
        )
        if handed:
            holding.lease_deadline = started + grant_ms / 1000
        self._took(hold_key, holding)
        if auto_renew:
            watchdog.watch(holding)
        # a handoff came after `started` (see wait_turn); the wait ended now
        self._announce_acquired((time.monotonic() if handed else started) - begun, value)
        return None

    async def _clean_up(self, conn: AsyncConnection, keys: list[Any], args: list[Any]) -> None:
        """After an interrupted acquire (a cancelled task, a timeout): leave the
        queue, and undo a grant or handoff Redis may have made just before the
        interruption, which would otherwise hold the lock for a lease with nobody
        to release it. One cancel script does both, and it runs whether or not
        the caller knew it was queued: the interrupted attempt may have queued
        it without the reply arriving. Best effort: a Redis error here must not
        replace the original exception."""
        try:
            await conn.run(LOCK_CANCEL, keys, args)
        except backend.BACKEND_ERRORS as exc:
            logger.debug("Could not clean up an interrupted acquire of %r: %s", self.name, exc)

    async def release(self) -> None:
        """Release one level of the current task's hold (see ``Lock.release``)."""
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        holding.releasing = holding.depth <= 1
        conn = AsyncConnection(holding.client)
        try:
            try:
                with backend.translate_errors(self.name):
                    result = await conn.run(
                        LOCK_RELEASE,
                        holding.keys,
                        self._release_args(holding.token, holding.sigprefix, holding.stats_ttl_ms),
                    )
            except BaseException:
                self._release_failed(holding)
                raise
            self._after_release(holding, result)
        finally:
            self._left(holding)

    async def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease from now on (see ``Lock.extend``)."""
        lease = check_lease(seconds, "seconds")
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        lease = lease or holding.lease
        started = time.monotonic()
        conn = AsyncConnection(holding.client)
        with backend.translate_errors(self.name):
            result = await conn.run(LOCK_EXTEND, holding.keys, [holding.token, int(lease * 1000)])
        if not result:
            holding.mark_lost("the lease was gone when the holder extended it")
            raise self._lost(holding)
        holding.set_lease(lease, started)

    async def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        settings = self._settings()
        keys, _ = self._key_set(settings.key_prefix)
        with backend.translate_errors(self.name):
            return bool(await AsyncConnection(self._client(settings)).call("exists", keys[0]))

    async def owned(self) -> bool:
        """Whether the current task holds the lock, according to Redis."""
        holding = self._holding()
        if holding is None:
            return False
        keys, _ = self._key_set(self._settings().key_prefix)
        with backend.translate_errors(self.name):
            value = await AsyncConnection(holding.client).call("get", keys[0])
        state = parse_lock_value(value)
        return state is not None and state.token == holding.token

    async def ttl(self) -> float | None:
        """Seconds left on the current lease (anyone's), or ``None`` when free."""
        settings = self._settings()
        keys, _ = self._key_set(settings.key_prefix)
        with backend.translate_errors(self.name):
            remaining = await AsyncConnection(self._client(settings)).call("pttl", keys[0])
        return remaining / 1000.0 if remaining >= 0 else None
