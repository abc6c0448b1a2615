from __future__ import annotations

import asyncio

from django_redislock import AsyncLock, Lock


def test_async_lock_round_trip_on_the_native_asyncio_client() -> None:
    async def main() -> tuple[bool, bool, bool]:
        lock = AsyncLock("async:1")
        async with lock:
            inside = await lock.locked(), await lock.owned()
        return *inside, await lock.locked()

    assert asyncio.run(main()) == (True, True, False)
    assert not Lock("async:1").locked()
