"""The asyncio mirror of a django-redis pool must connect with redis-py's defaults."""

from __future__ import annotations

import asyncio

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
