"""The asyncio mirror of a django-redis pool must connect with redis-py's defaults."""

from __future__ import annotations

import asyncio
from typing import Any

from django_redislock import AsyncLock, Lock


def test_async_lock_round_trip_through_the_native_asyncio_client() -> None:
    async def main() -> int | None:
        lock = AsyncLock("mirror", timeout=5, auto_renew=False)
        assert await lock.acquire(blocking=False)
        token = lock.fencing_token
        assert await lock.owned()
        assert Lock("mirror").acquire(blocking=False) is False
        await lock.release()
        assert not await lock.locked()
        return token

    assert isinstance(asyncio.run(main()), int)


def test_a_loop_per_call_leaks_neither_connections_nor_loops(redis_client: Any) -> None:
    """Async views under WSGI run each request in a new event loop (async_to_sync)."""
    from django_redislock import async_clients

    async def once(i: int) -> None:
        async with AsyncLock(f"loop:{i}", timeout=5):
            pass

    asyncio.run(once(-1))  # the sync pool's own connection exists from here on
    connected = redis_client.info("clients")["connected_clients"]
    for i in range(10):
        asyncio.run(once(i))
    assert redis_client.info("clients")["connected_clients"] <= connected
    assert async_clients._async_clients.loops() == 0


def test_waiters_on_the_thread_fallback_leave_the_default_executor_free(
    redis_url: str, redis_client: Any
) -> None:
    """Without an asyncio mirror (a BlockingConnectionPool, Sentinel, Cluster)
    the waits run on threads: on the library's own, never on the loop's
    default executor, which each waiter held for up to 2 s (found by a review:
    a few waiters stalled every ``asyncio.to_thread`` of the site)."""
    import concurrent.futures
    import time

    import redis
    from django.test import override_settings

    from django_redislock import backend
    from tests.settings import redis_cache

    caches = {
        "default": redis_cache(
            # a URL of its own: django-redis keeps one pool per URL, whatever its class
            f"{redis_url}?health_check_interval=0",
            CONNECTION_POOL_CLASS="redis.BlockingConnectionPool",
            CONNECTION_POOL_KWARGS={"max_connections": 50},
        )
    }
    waiters = 3

    async def main() -> float:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=1)
        )
        holder = AsyncLock("starve", timeout=30)
        assert await holder.acquire()
        locks = [AsyncLock("starve", blocking_timeout=30) for _ in range(waiters)]
        tasks = [asyncio.create_task(lock.acquire()) for lock in locks]
        deadline = time.monotonic() + 10
        while redis_client.zcard("redislock:{starve}:queue") < waiters:  # all queued
            assert time.monotonic() < deadline, "the waiters never queued"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.to_thread(lambda: None)
        elapsed = time.monotonic() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await holder.release()
        assert redis_client.zcard("redislock:{starve}:queue") == 0
        assert not await holder.locked()
        return elapsed

    with override_settings(CACHES=caches):
        pool = backend.get_client("default").connection_pool
        assert type(pool) is redis.BlockingConnectionPool  # no mirror: the fallback
        assert asyncio.run(main()) < 0.5
