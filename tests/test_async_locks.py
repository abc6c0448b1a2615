from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis

from django_redislock import (
    AsyncLock,
    AsyncSemaphore,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)
from django_redislock import signals as lock_signals
from django_redislock.async_locks import AsyncConnection
from django_redislock.state import parse_lock_value
from tests.signals_helper import capture

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    """Poll Redis state that has no event of its own (e.g. "is queued")."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


@pytest.fixture(params=["native", "thread"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run on the asyncio mirror pool and on the worker-thread fallback (``aio=None``),
    which is what Sentinel and Cluster topologies use."""
    if request.param == "thread":
        monkeypatch.setattr("django_redislock.async_clients.get_async_client", lambda client: None)
    return str(request.param)


def test_fallback_path_has_no_asyncio_client(path: str, redis_client: redis.Redis) -> None:
    async def main() -> bool:
        return AsyncConnection(redis_client).aio is None

    assert run(main()) is (path == "thread")


def test_acquire_release_owned_locked_ttl_extend(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        lock = AsyncLock("a:1", timeout=5, auto_renew=False)
        assert not await lock.locked()
        assert not await lock.owned()
        assert await lock.ttl() is None
        assert await lock.acquire()
        assert await lock.locked()
        assert await lock.owned()
        assert lock.fencing_token is not None
        ttl = await lock.ttl()
        assert ttl is not None and 0 < ttl <= 5
        await lock.extend(60)
        ttl = await lock.ttl()
        assert ttl is not None and 5 < ttl <= 60
        assert redis_client.exists("redislock:{a:1}:lock")
        await lock.release()
        assert not await lock.locked()
        assert lock.fencing_token is None
        with pytest.raises(LockNotOwnedError):
            await lock.release()
        with pytest.raises(LockNotOwnedError):
            await lock.extend()

    run(main())


def test_nesting_in_one_task(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        lock = AsyncLock("nest")
        async with lock:
            token = lock.fencing_token
            async with lock:
                assert lock.fencing_token == token
                state = parse_lock_value(redis_client.get("redislock:{nest}:lock"))
                assert state is not None and state.count == 2
            assert await lock.locked()
        assert not await lock.locked()

    run(main())


def test_two_tasks_are_two_holders(path: str) -> None:
    async def main() -> None:
        lock = AsyncLock("tasks")
        await lock.acquire()

        async def other() -> tuple[bool, bool]:
            return await lock.acquire(blocking=False), await lock.owned()

        assert await asyncio.create_task(other()) == (False, False)
        assert await lock.owned()
        await lock.release()

    run(main())


async def hold_in_another_task(
    name: str, **options: Any
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Hold ``name`` from a task of its own until the returned event is set."""
    held, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with AsyncLock(name, **options):
            held.set()
            await done.wait()

    task = asyncio.create_task(hold())
    await held.wait()
    return done, task


def test_timeout_raises_lock_timeout_with_retry_after(path: str) -> None:
    async def main() -> None:
        done, holder = await hold_in_another_task("busy", timeout=20)
        with capture(lock_signals.lock_contended) as contended:
            with pytest.raises(LockTimeout) as info:
                async with AsyncLock("busy", blocking_timeout=0.05):
                    pass
        assert info.value.name == "busy"
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
        assert [c["name"] for c in contended] == ["busy"]
        done.set()
        await holder

    run(main())


def test_lost_lease_raises_at_async_with_exit(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        with capture(lock_signals.lock_lost) as lost:
            with pytest.raises(LockLostError):
                async with AsyncLock("lost", auto_renew=False):
                    redis_client.delete("redislock:{lost}:lock")
        assert [c["name"] for c in lost] == ["lost"]

    run(main())


def test_handoff_wakes_a_waiting_task_promptly(path: str, redis_client: redis.Redis) -> None:
    async def main() -> float:
        holder = AsyncLock("handoff", timeout=30)
        await holder.acquire()
        waiter = AsyncLock("handoff", blocking_timeout=20)

        async def wait() -> float:
            async with waiter:
                return time.monotonic()

        task = asyncio.create_task(wait())
        await until(lambda: asyncio.to_thread(redis_client.zcard, "redislock:{handoff}:queue"))
        released = time.monotonic()
        await holder.release()
        return await asyncio.wait_for(task, 20) - released

    # woken by the release: not by the 30 s lease nor the 2 s fallback re-check
    assert run(main()) < 1.0


def test_cancelled_waiter_leaves_no_queue_entry(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        holder = AsyncLock("cancel", timeout=30)
        await holder.acquire()
        task = asyncio.create_task(AsyncLock("cancel", blocking_timeout=20).acquire())
        await until(lambda: asyncio.to_thread(redis_client.zcard, "redislock:{cancel}:queue"))
        # Cancel it once it is blocked on its signal: a cancellation that lands
        # while redis.asyncio writes a command can be lost before Python 3.12
        # (see test_a_cancellation_lost_in_a_wait_is_honoured).
        await until(lambda: asyncio.to_thread(blocked_clients, redis_client))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert redis_client.zcard("redislock:{cancel}:queue") == 0
        await holder.release()
        # nobody is left in line: a newcomer gets the free lock at once
        assert await AsyncLock("cancel").acquire(blocking=False)

    run(main())


def test_signals_and_fencing(path: str) -> None:
    async def main() -> None:
        tokens = []
        with (
            capture(lock_signals.lock_acquired) as acquired,
            capture(lock_signals.lock_released) as released,
        ):
            for _ in range(3):
                async with AsyncLock("sig") as lock:
                    tokens.append(lock.fencing_token)
        assert [c["fencing_token"] for c in acquired] == tokens
        assert all(c["sender"] is AsyncLock and c["kind"] == "lock" for c in acquired)
        assert len(released) == 3
        assert tokens == sorted(tokens) and len(set(tokens)) == 3

    run(main())


def test_watchdog_renews_async_holds(path: str) -> None:
    async def main() -> None:
        lock = AsyncLock("long", timeout=0.6)
        async with lock:
            await asyncio.sleep(2.0)  # more than three leases
            assert await lock.owned()

    run(main())


def test_a_nested_acquire_after_the_lease_was_lost_takes_it_afresh(
    path: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        lock = AsyncLock("nest-lost", auto_renew=False)
        with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError):
            async with lock:  # told at its exit that its hold was lost
                first = lock.fencing_token
                redis_client.delete("redislock:{nest-lost}:lock")
                with pytest.raises(LockLostError):
                    await lock.extend()
                async with AsyncLock("nest-lost", blocking_timeout=0) as inner:
                    # asked Redis, not the task's stale record: a hold of its own
                    assert await inner.owned()
                    assert inner.fencing_token is not None and first is not None
                    assert inner.fencing_token > first
                    state = parse_lock_value(redis_client.get("redislock:{nest-lost}:lock"))
                    assert state is not None and state.count == 1
                assert not await lock.owned()
        assert [call["name"] for call in lost] == ["nest-lost"]
        assert not await lock.locked()

    run(main())


def test_another_async_lock_in_the_holding_task_reenters(path: str) -> None:
    async def main() -> None:
        async with AsyncLock("task-holds") as outer:
            async with AsyncLock("task-holds", blocking_timeout=0) as inner:
                assert inner.fencing_token == outer.fencing_token
                assert await inner.owned()

            async def child() -> bool:  # a task never inherits its parent's holds
                return await AsyncLock("task-holds").acquire(blocking=False)

            assert await asyncio.create_task(child()) is False
            assert await outer.locked()
        assert not await outer.locked()

    run(main())


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 does not count cancellation requests"
)
@pytest.mark.parametrize(
    ("make", "queue"),
    [
        (lambda **kw: AsyncLock("lost-cancel", **kw), "redislock:{lost-cancel}:queue"),
        (lambda **kw: AsyncSemaphore("lost-cancel", 1, **kw), "redislock:{lost-cancel}:sem:queue"),
    ],
    ids=["AsyncLock", "AsyncSemaphore"],
)
def test_a_cancellation_lost_in_a_wait_is_honoured(
    make: Callable[..., Any], queue: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Python 3.12 ``asyncio.wait_for`` (under which redis.asyncio writes
    each command) can return normally when its task is cancelled; a waiter
    must still stop waiting, leave the queue and raise ``CancelledError``."""
    real_call = AsyncConnection.call
    waiting = asyncio.Event()

    async def call_losing_cancellation(
        self: AsyncConnection, command: str, *a: Any, **k: Any
    ) -> Any:
        if command != "blpop":
            return await real_call(self, command, *a, **k)
        waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return None  # what wait_for does when the write has just completed
        return None

    monkeypatch.setattr(AsyncConnection, "call", call_losing_cancellation)

    async def main() -> None:
        holder = make(timeout=30)
        await holder.acquire()
        task = asyncio.create_task(make(blocking_timeout=20).acquire())
        await asyncio.wait_for(waiting.wait(), 10)
        assert redis_client.zcard(queue) == 1  # queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)  # not after the 20 s blocking timeout
        assert redis_client.zcard(queue) == 0
        await holder.release()

    run(main())
