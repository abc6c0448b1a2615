"""The asyncio mirror of a django-redis pool must connect with redis-py's defaults."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

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
    from django_redislock.backend import aio as async_clients

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

    from django_redislock.backend import client as backend
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


@pytest.mark.usefixtures("real_redis")  # blocked_clients, from INFO
def test_a_release_on_the_thread_fallback_does_not_wait_for_the_waiters_threads(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an asyncio mirror, commands run on worker threads
    (``bounds.workers``, 16 per server), and waits on the process's shared
    wake-up connection, on no worker at all. A waiter's ``BLPOP`` once ran on
    those threads: with 16 waiters in their waits, a release, and every
    attempt, queued until a wait ended, up to a wait chunk later (2 s each
    handoff by default; the waiters of a busy name then gave up on a healthy
    Redis)."""
    import redis
    from django.test import override_settings

    from django_redislock.backend import client as backend
    from django_redislock.engine import bounds
    from django_redislock.engine.wakeups import wakeups
    from tests.settings import redis_cache

    monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda client: None)
    monkeypatch.setattr(
        "django_redislock.backend.client.MAX_WAIT_CHUNK", 10.0
    )  # long waits: a late release shows
    # a URL of its own: django-redis keeps one pool per URL, whatever its options
    caches = {"default": redis_cache(f"{redis_url}?client_name=waits", SOCKET_TIMEOUT=None)}
    waiters = 2 * bounds.MAX_WORKERS
    queue = "redislock:{crowd}:queue"

    async def main() -> tuple[float, float]:
        holder = AsyncLock("crowd", timeout=60)
        assert await holder.acquire()

        async def wait_in_line() -> None:
            async with AsyncLock("crowd", timeout=60, blocking_timeout=40):
                pass

        tasks = [asyncio.create_task(wait_in_line()) for _ in range(waiters)]
        deadline = time.monotonic() + 20
        while redis_client.zcard(queue) < waiters or wakeups.waiters() < waiters:
            assert time.monotonic() < deadline, (
                "the waiters never all waited",
                redis_client.zcard(queue),
                wakeups.waiters(),
            )
            await asyncio.sleep(0.01)
        # the shared wake-up connection; between two of its BLPOPs (a nudge
        # for the last waiter that joined), none for a moment
        while (now_blocked := blocked(redis_client)) != 1:
            assert now_blocked == 0, f"{now_blocked} connections blocked"
            assert time.monotonic() < deadline, "the wake-up connection never blocked"
            await asyncio.sleep(0.01)
        other = AsyncLock("other", blocking_timeout=3)  # uncontended, on the same server
        assert await other.acquire(), "an uncontended acquire waited for the waiters' threads"
        await other.release()
        started = time.monotonic()
        await holder.release()
        released = time.monotonic() - started
        await asyncio.wait_for(asyncio.gather(*tasks), 40)
        return released, time.monotonic() - started

    with override_settings(CACHES=caches):
        assert type(backend.get_client("default").connection_pool) is redis.ConnectionPool
        released, everyone = asyncio.run(main())
    assert released < 2.0, f"the release waited {released:.1f} s for a thread"
    assert everyone < 5.0, f"{waiters} handoffs took {everyone:.1f} s"
    assert redis_client.zcard(queue) == 0


def blocked(client: Any, name: str = "waits") -> int:
    """Clients of this test's pool (``client_name``) blocked in a command now."""
    return sum(c["name"] == name and "b" in c["flags"] for c in client.client_list())
