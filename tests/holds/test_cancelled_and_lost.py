"""A release cut short by a cancellation, and holds the watchdog found lost.

Found by an independent review: an ``async with`` whose release was cancelled
before its command reached Redis left the lock (or permit) held by nobody for
its whole lease; an ``extend()`` after the watchdog had reported the lease lost
succeeded on what was left of it, and nothing renewed it afterwards; and the
outer level of a nested ``with`` on one handle whose lease was lost raised
``LockNotOwnedError`` instead of ``LockLostError``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from django_redislock import (
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    Lock,
    LockLostError,
    LockNotOwnedError,
)
from django_redislock.backend.scripts import LOCK_RELEASE, PERMIT_RELEASE
from django_redislock.engine import drivers
from django_redislock.holds.watchdog import watchdog

#: Each primitive's holder key under ``redislock:{<name>}:``, and its release script.
ASYNC_KINDS = {
    "AsyncLock": ("lock", LOCK_RELEASE),
    "AsyncSemaphore": ("semaphore", PERMIT_RELEASE),
    "AsyncReadWriteLock": ("rwlock", PERMIT_RELEASE),
}


def _async_primitive(kind: str, name: str) -> Any:
    if kind == "AsyncLock":
        return AsyncLock(name, timeout=60)
    if kind == "AsyncSemaphore":
        return AsyncSemaphore(name, 1, timeout=60)
    return AsyncReadWriteLock(name, timeout=60).write()


@pytest.mark.parametrize("kind", list(ASYNC_KINDS))
def test_a_release_cancelled_before_it_reaches_redis_still_frees_the_name(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    holder_part, release_script = ASYNC_KINDS[kind]
    name = f"cancelled-release-{kind}"
    key = f"redislock:{{{name}}}:{holder_part}"
    real_run = drivers.AsyncConnection.run

    async def main() -> None:
        entered, gate, sent = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def held_back(self: Any, script: Any, keys: Any, args: Any) -> Any:
            if script is not release_script:
                return await real_run(self, script, keys, args)
            entered.set()
            await gate.wait()  # say, reconnecting, or waiting for a pooled connection
            try:
                return await real_run(self, script, keys, args)
            finally:
                sent.set()

        monkeypatch.setattr("django_redislock.engine.drivers.AsyncConnection.run", held_back)

        async def hold() -> None:  # the holder is a task: it takes and returns the lock
            async with _async_primitive(kind, name):
                pass

        holding = asyncio.create_task(hold())
        await entered.wait()
        holding.cancel()  # an asyncio.timeout or a TaskGroup ending around the block
        with pytest.raises(asyncio.CancelledError):
            await holding
        gate.set()
        await asyncio.wait_for(sent.wait(), 10)

    asyncio.run(main())
    assert redis_client.exists(key) == 0, "the cancelled release never reached Redis"


def test_an_extend_after_the_watchdog_reported_the_lease_lost_raises(
    redis_client: redis.Redis,
) -> None:
    """The watchdog gave up (Redis unreachable for most of the lease) and told
    the holder, while Redis still had some of the lease: the hold stays lost."""
    lock = Lock("extend-after-lost", timeout=30)
    assert lock.acquire()
    holding = lock._holding()
    assert holding is not None
    watchdog.settling.lose(holding, "could not reach Redis")  # what a renewal that gave up does
    assert redis_client.pttl("redislock:{extend-after-lost}:lock") > 0  # some lease left
    with pytest.raises(LockLostError, match="could not reach Redis"):
        lock.extend(60)
    assert redis_client.pttl("redislock:{extend-after-lost}:lock") <= 30_000  # not extended
    with pytest.raises(LockLostError):
        lock.release()
    assert redis_client.exists("redislock:{extend-after-lost}:lock") == 0


def test_nested_levels_of_one_handle_each_report_a_lost_lease(redis_client: redis.Redis) -> None:
    lock = Lock("nested-lost", timeout=30)
    assert lock.acquire() and lock.acquire()
    redis_client.delete("redislock:{nested-lost}:lock")
    with pytest.raises(LockLostError):
        lock.release()
    with pytest.raises(LockLostError):  # not LockNotOwnedError: this level was held, and lost
        lock.release()
    with pytest.raises(LockNotOwnedError):  # and nothing is left
        lock.release()


def test_a_nested_with_on_one_handle_raises_lock_lost_error(redis_client: redis.Redis) -> None:
    lock = Lock("nested-with-lost", timeout=30)
    with pytest.raises(LockLostError) as info, lock, lock:
        redis_client.delete("redislock:{nested-with-lost}:lock")
    assert type(info.value) is LockLostError


def test_nested_levels_of_one_async_handle_each_report_a_lost_lease(
    redis_client: redis.Redis,
) -> None:
    async def main() -> None:
        lock = AsyncLock("async-nested-lost", timeout=30)
        with pytest.raises(LockLostError) as info:
            async with lock, lock:
                redis_client.delete("redislock:{async-nested-lost}:lock")
        assert type(info.value) is LockLostError
        with pytest.raises(LockNotOwnedError):
            await lock.release()

    asyncio.run(main())
