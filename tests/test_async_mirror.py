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
