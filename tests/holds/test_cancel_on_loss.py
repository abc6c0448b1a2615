"""``cancel_on_loss=True``: an asyncio holder stopped at once when its lease is lost.

The holding task is cancelled on its own loop; leaving the ``async with``
raises ``LockLostError`` chained to that ``CancelledError``; a cancellation
from elsewhere still propagates as ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
import redis

from django_redislock import AsyncLock, AsyncReadWriteLock, AsyncSemaphore, LockLostError

#: Each asyncio primitive, built with the options given, and its holders' key part.
KINDS = {
    "AsyncLock": (lambda name, **o: AsyncLock(name, **o), "lock"),
    "AsyncSemaphore": (lambda name, **o: AsyncSemaphore(name, 2, **o), "semaphore"),
    "AsyncReadWriteLock.read": (lambda name, **o: AsyncReadWriteLock(name, **o).read(), "rwlock"),
    "AsyncReadWriteLock.write": (
        lambda name, **o: AsyncReadWriteLock(name, **o).write(),
        "rwlock",
    ),
}


async def delete_from_another_process(url: str, key: str) -> None:
    code = f"import redis; assert redis.Redis.from_url({url!r}).delete({key!r}) == 1"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    assert await asyncio.wait_for(proc.wait(), 60) == 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_task_stuck_in_a_wait_is_cancelled_and_the_block_raises_lock_lost(
    redis_url: str, kind: str
) -> None:
    build, part = KINDS[kind]
    name = f"cancel:{kind}"

    async def main() -> None:
        held = asyncio.Event()
        never = asyncio.Event()

        async def job() -> None:
            async with build(name, timeout=0.6, cancel_on_loss=True):
                held.set()
                await never.wait()  # stuck: only the cancel ends it

        task = asyncio.create_task(job())
        await asyncio.wait_for(held.wait(), 30)
        await delete_from_another_process(redis_url, f"redislock:{{{name}}}:{part}")
        with pytest.raises(LockLostError, match="watchdog renewed it") as info:
            await asyncio.wait_for(task, 30)
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        if sys.version_info >= (3, 11):
            assert task.cancelling() == 0  # the loss's cancel was withdrawn

    asyncio.run(main())


def test_max_hold_cancels_a_task_in_a_long_sleep(redis_client: redis.Redis) -> None:
    async def main() -> None:
        async def job() -> None:
            async with AsyncLock("cancel:capped", timeout=0.6, max_hold=1.0, cancel_on_loss=True):
                await asyncio.sleep(120)

        with pytest.raises(LockLostError, match="held longer than max_hold=1s"):
            await asyncio.wait_for(job(), 60)

    asyncio.run(main())


def test_the_lost_flag_of_a_task_that_is_not_cancelled(redis_client: redis.Redis) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        told = asyncio.Event()
        lock = AsyncLock(
            "cancel:flag", timeout=0.6, on_lost=lambda h: loop.call_soon_threadsafe(told.set)
        )
        with pytest.raises(LockLostError):
            async with lock:
                assert not lock.lost
                await asyncio.to_thread(redis_client.delete, "redislock:{cancel:flag}:lock")
                await asyncio.wait_for(told.wait(), 30)
                assert lock.lost  # this task's hold
                with pytest.raises(LockLostError):
                    lock.check()
        assert not lock.lost
        lock.check()

    asyncio.run(main())
    assert not AsyncLock("cancel:flag").lost  # outside any task: holds nothing


def test_an_outside_cancellation_still_propagates(redis_client: redis.Redis) -> None:
    async def main() -> None:
        held = asyncio.Event()

        async def job() -> None:
            async with AsyncLock("cancel:outside", timeout=5, cancel_on_loss=True):
                held.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(job())
        await asyncio.wait_for(held.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not redis_client.exists("redislock:{cancel:outside}:lock")  # released

    asyncio.run(main())


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 does not count cancellation requests"
)
def test_an_outside_cancellation_together_with_the_loss_still_propagates(
    redis_client: redis.Redis,
) -> None:
    """The on_lost callback cancels the task too, right behind the loss's own
    cancel; the loop is held until both are queued, so both land before the
    task runs again: one is the loss's, withdrawn on leaving; the other must
    still be a CancelledError."""
    import threading

    async def main() -> None:
        loop = asyncio.get_running_loop()
        held = asyncio.Event()
        queued = threading.Event()
        tasks: list[asyncio.Task[Any]] = []

        def also_cancel(hold: Any) -> None:
            loop.call_soon_threadsafe(tasks[0].cancel)  # behind the loss's own cancel
            queued.set()

        async def job() -> None:
            lock = AsyncLock("cancel:both", timeout=0.6, cancel_on_loss=True, on_lost=also_cancel)
            async with lock:
                held.set()
                await asyncio.Event().wait()

        tasks.append(asyncio.create_task(job()))
        await asyncio.wait_for(held.wait(), 30)
        await asyncio.to_thread(redis_client.delete, "redislock:{cancel:both}:lock")
        assert queued.wait(30)  # holds the loop (deliberately) until both are queued
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(tasks[0]), 30)
        assert tasks[0].cancelled()

    asyncio.run(main())
