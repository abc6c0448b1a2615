"""The asyncio side of a step's connection: ``AsyncConnection`` (natively, in
a slot of the asyncio mirror pool, or on a worker thread where the topology
has no asyncio client), and the worker-thread helpers whose cancellation
carries what a clean-up must follow (``in_thread``, ``follow``). The drivers
(``engine/drivers.py``) run steps on it; a primitive's release is sent on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django_redislock.backend import aio as async_clients
from django_redislock.backend import client as backend
from django_redislock.engine import bounds, janitor, pool

if TYPE_CHECKING:
    from collections.abc import Sequence

    from django_redislock.backend.scripts import Script

T = TypeVar("T")
logger = logging.getLogger(__name__)


def _cancel_requests() -> int:
    """How many cancellations of the current task are pending (0 before Python 3.11)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


class AsyncConnection:
    """Run scripts and commands on asyncio, natively or in a worker thread.

    Natively, each command first takes one of the mirror pool's slots
    (``aio.mirror``): the pool is this package's own, so the slots count
    its connections exactly, and a full pool is a wait for a slot within the
    step's budget (``take``), told apart from a Redis that does not answer."""

    def __init__(self, sync_client: Any) -> None:
        self.sync = sync_client
        found = async_clients.mirror(sync_client)
        self.aio: Any = None if found is None else found[0]
        self.slots: asyncio.Semaphore | None = None if found is None else found[1]
        self._cancels_before = _cancel_requests()

    async def take(self, deadline: float | None) -> None:
        """A slot of the mirror pool, waiting for one until ``deadline``
        (``None``: ``pool.PATIENCE``); then ``PoolExhausted``."""
        slots = self.slots
        if slots is None:
            return
        if not slots.locked():  # the common case: no wait
            await slots.acquire()
            return
        until = time.monotonic() + pool.PATIENCE if deadline is None else deadline
        try:
            await time_boxed(slots.acquire(), until - time.monotonic())
        except backend.TIMEOUTS as exc:
            size = async_clients.size_of(self.aio)
            raise backend.PoolExhausted(
                f"no free connection in the asyncio pool (max_connections={size})", size
            ) from exc

    def give_back(self) -> None:
        if self.slots is not None:
            self.slots.release()

    async def run(self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        """``script``, natively in a slot its caller took, or on a worker thread."""
        if self.aio is not None:
            return await script.run_async(self.aio, keys, args)
        return await in_thread(_waiting_for_a_connection, self.sync, script, keys, args)

    async def send(self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        """``run`` in a slot of the mirror pool, waited for up to ``pool.PATIENCE``."""
        await self.take(None)
        try:
            return await self.run(script, keys, args)
        finally:
            self.give_back()

    async def run_to_the_end(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        """``send``, seen through: a release goes on to Redis when its caller
        is cancelled (an ``asyncio.timeout`` or a ``TaskGroup`` ending around
        an ``async with``). Cut short, it would leave the lock or permit held
        by nobody for its whole lease; the caller still gets
        ``CancelledError`` at once.

        It runs in the caller's task: a task of its own for every release
        (``asyncio.shield``) cost a task and two more turns of the loop per
        release, a third of what ``AsyncLock`` cost beyond redis.asyncio's
        lock. Only a cancellation that cuts it short sends it again, in a task
        of its own that the caller does not wait for (``_resent``); sent
        twice, a release is harmless: the second finds the token gone, and an
        inner level's never frees the lock. That task exists before the
        caller's cancellation goes on, so a loop that ends then (``asyncio.run``
        returned, Ctrl-C) cancels it with every task left, and waits for it."""
        if sys.version_info < (3, 12):
            # redis.asyncio writes under asyncio.wait_for, which before 3.12 can
            # swallow a cancellation that lands as the write ends (gh-86296): the
            # caller would never see it. A task of its own keeps the caller's.
            return await asyncio.shield(self._resent(script, keys, args))
        try:
            return await self.send(script, keys, args)
        except asyncio.CancelledError:
            resend = asyncio.ensure_future(self._resent(script, keys, args))
            resend.add_done_callback(_retrieved)
            raise

    async def _resent(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        """The release again, after its caller's was cut short; cancelled in
        turn (the loop is ending, ``run_to_the_end``), once more, time-boxed:
        a hung Redis must not hold the exit up."""
        try:
            return await self.send(script, keys, args)
        except asyncio.CancelledError:
            uncancel = getattr(asyncio.current_task(), "uncancel", None)
            if uncancel is not None:  # Python 3.11+: no cancellation pending now
                uncancel()
        return await time_boxed(self.send(script, keys, args), janitor.CLEANUP_TIMEOUT)

    def honour_lost_cancellation(self) -> None:
        """Raise ``CancelledError`` if the task was cancelled during a step
        that returned all the same.

        redis.asyncio writes each command under ``asyncio.wait_for``, which
        before Python 3.12 returns normally when the task is cancelled just as
        the write completes (CPython gh-86296): a waiter would carry on
        waiting until its ``blocking_timeout``, an attempt would return the
        grant to a task that was cancelled. Python 3.11 still counts the
        request (``Task.cancelling``, compared with its count when this
        connection was made), so ``run_async`` honours it after each step; on
        Python 3.10 the lost cancellation cannot be seen.
        """
        if _cancel_requests() > self._cancels_before:
            raise asyncio.CancelledError

    async def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if self.aio is not None:
            await self.take(None)
            try:
                return await getattr(self.aio, command)(*args, **kwargs)
            finally:
                self.give_back()
        run = functools.partial(getattr(self.sync, command), *args, **kwargs)
        future = bounds.workers.submit(contextvars.copy_context().run, run, server=self.sync)
        return await asyncio.wrap_future(future)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A re-sent release's outcome, which nobody awaits: a failure is only
    logged (the lease frees the name), never "exception was never retrieved"."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("A release sent again after a cancellation failed: %s", task.exception())


async def time_boxed(run: Awaitable[T], seconds: float) -> T:
    """``run``, given up (``TimeoutError``) after ``seconds``."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await run
    return await asyncio.wait_for(run, seconds)


def _waiting_for_a_connection(
    client: Any, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
) -> Any:
    """``script`` on a synchronous ``client``, a full pool waited for (``pool.PATIENCE``)."""
    return pool.call(client, None, script, client, keys, args)


async def in_thread(func: Callable[..., T], server: Any, *args: Any) -> T:
    """``asyncio.to_thread(func, server, *args)`` on ``server``'s bounded
    commands' daemon workers (not joined at exit), except when cancelled: the ``CancelledError``
    then carries ``after``, the command's future while it may still reach
    Redis (``None`` when it never started, or ended). The attempt's clean-up
    follows it (``janitor.Janitor``): sent at once on another connection, it
    could reach Redis first, find nothing to undo, and the late acquire would
    leave the name held by nobody for its whole lease."""
    run = contextvars.copy_context().run
    future = bounds.workers.submit(run, func, server, *args, server=server)
    return await follow(asyncio.wrap_future(future), future)


async def follow(run: Awaitable[T], future: concurrent.futures.Future[Any]) -> T:
    """Await ``run``, ``future``'s on a worker thread; a cancellation carries
    what a clean-up must follow (``in_thread``)."""
    try:
        return await run
    except asyncio.CancelledError as exc:
        exc.after = None if future.cancel() or future.done() else future  # type: ignore[attr-defined]
        raise
