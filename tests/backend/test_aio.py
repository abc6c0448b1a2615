"""The asyncio mirror of a django-redis connection pool."""

from __future__ import annotations

import asyncio

from django_redislock import AsyncLock
from django_redislock.backend import aio as async_clients
from django_redislock.backend import client as backend


def test_async_mirror_of_the_django_redis_pool_answers() -> None:
    """redis-py 6+ puts sync-only objects (RESP2 parser class, maintenance
    notification handlers) in the pool's connection kwargs; copying them into
    an asyncio connection made every async call fail."""

    async def main() -> bool:
        client = async_clients.mirror(backend.get_client("default"))[0]
        assert client is not None
        pong = bool(await client.ping())
        async with AsyncLock("mirror"):
            pass
        await client.aclose()
        return pong

    assert asyncio.run(main())
