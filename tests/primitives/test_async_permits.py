"""``AsyncSemaphore`` and ``AsyncReadWriteLock`` (driven with ``asyncio.run``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redislock import (
    AsyncReadWriteLock,
    AsyncSemaphore,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
    Semaphore,
)


def test_async_semaphore_limits_tasks_and_hands_over() -> None:
    async def main() -> tuple[int, int]:
        inside = peak = 0

        async def worker() -> None:
            nonlocal inside, peak
            async with AsyncSemaphore("aio", 2, blocking_timeout=20) as sem:
                assert sem.fencing_token is not None
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.02)
                inside -= 1

        await asyncio.gather(*(worker() for _ in range(6)))
        return peak, inside

    assert asyncio.run(main()) == (2, 0)


def test_async_semaphore_shares_permits_with_sync_users() -> None:
    sync_holder = Semaphore("mixed", 1)
    sync_holder.acquire()

    async def main() -> None:
        sem = AsyncSemaphore("mixed", 1)
        assert not await sem.acquire(blocking=False)
        with pytest.raises(LockTimeout):
            async with AsyncSemaphore("mixed", 1, blocking_timeout=0.05):
                pass
        sync_holder.release()
        assert await sem.acquire(blocking=False)
        assert await sem.owned()
        assert len(await sem.holders()) == 1
        await sem.extend(5)
        await sem.release()
        with pytest.raises(LockNotOwnedError):
            await sem.release()

    asyncio.run(main())


def test_async_waiter_woken_by_release() -> None:
    async def main() -> float:
        holder = AsyncSemaphore("wake", 1, timeout=30)
        await holder.acquire()
        waited = []

        async def wait() -> None:
            sem = AsyncSemaphore("wake", 1, blocking_timeout=20)
            start = time.monotonic()
            assert await sem.acquire()
            waited.append(time.monotonic() - start)
            await sem.release()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await holder.release()
        await task
        assert waited
        return time.monotonic() - released

    assert asyncio.run(main()) < 1.5


def test_async_lost_permit_is_reported(redis_client: object) -> None:
    async def main() -> None:
        sem = AsyncSemaphore("alost", 1, auto_renew=False)
        await sem.acquire()
        redis_client.delete("redislock:{alost}:semaphore")  # type: ignore[attr-defined]
        with pytest.raises(LockLostError):
            await sem.release()

    asyncio.run(main())


def test_async_read_write_lock() -> None:
    async def main() -> None:
        rw = AsyncReadWriteLock("arw", blocking_timeout=0.05)
        async with rw.read(), rw.read():
            assert [h.mode for h in await rw.holders()] == ["read", "read"]
            with pytest.raises(LockTimeout):
                async with rw.write():
                    pass
        async with rw.write() as writer:
            assert await writer.owned()
            assert not await rw.read().acquire(blocking=False)
        assert await rw.holders() == []

    asyncio.run(main())
