from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockBackendError
from tests.holders import OtherThread
from tests.servers import RedisServer, free_port
from tests.settings import redis_cache

SOCKET_TIMEOUT = 0.5


@contextmanager
def cache_at(url: str, **options: object) -> Iterator[None]:
    with override_settings(CACHES={"default": redis_cache(url, **options)}):
        yield


def test_refused_connection_raises_backend_error_quickly() -> None:
    with cache_at(f"redis://127.0.0.1:{free_port()}/0", SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT):
        started = time.monotonic()
        with pytest.raises(LockBackendError) as info:
            Lock("down").acquire()
        elapsed = time.monotonic() - started
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    assert info.value.name == "down"
    assert "unreachable" in str(info.value)
    assert elapsed < 3 * SOCKET_TIMEOUT


def test_server_that_stops_answering_raises_backend_error_within_socket_timeout(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    with cache_at(server.url, SOCKET_TIMEOUT=SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT):
        lock = Lock("hung")
        assert lock.locked() is False  # connected and working
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(LockBackendError) as info:
                lock.acquire()
            elapsed = time.monotonic() - started
        finally:
            server.process.send_signal(signal.SIGCONT)
    assert isinstance(info.value.__cause__, redis.TimeoutError | redis.ConnectionError)
    assert elapsed < 3 * SOCKET_TIMEOUT


def test_async_lock_on_a_hung_server_raises_backend_error_within_socket_timeout(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    import asyncio

    server = redis_server_factory()
    assert server.process is not None

    async def main() -> tuple[float, BaseException | None]:
        lock = AsyncLock("hung-async")
        assert await lock.locked() is False  # connected and working
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(LockBackendError) as info:
                await lock.acquire()
        finally:
            server.process.send_signal(signal.SIGCONT)
        return time.monotonic() - started, info.value.__cause__

    with cache_at(server.url, SOCKET_TIMEOUT=SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT):
        elapsed, cause = asyncio.run(main())
    assert isinstance(cause, redis.TimeoutError | redis.ConnectionError)
    assert elapsed < 3 * SOCKET_TIMEOUT


@pytest.fixture
def short_socket_timeout(redis_url: str) -> Iterator[None]:
    """django-redis with the 0.5 s socket timeout common in production."""
    with cache_at(redis_url, SOCKET_TIMEOUT=SOCKET_TIMEOUT):
        yield


@pytest.mark.usefixtures("short_socket_timeout")
def test_wait_longer_than_the_socket_timeout_succeeds() -> None:
    holds = threading.Event()

    def hold_for_three_seconds() -> None:
        with Lock("chunked", timeout=30):
            holds.set()
            time.sleep(3.0)  # the holder's work

    holder = threading.Thread(target=hold_for_three_seconds)
    holder.start()
    try:
        assert holds.wait(10)
        started = time.monotonic()
        assert Lock("chunked", blocking_timeout=20).acquire()
        waited = time.monotonic() - started
    finally:
        holder.join(20)
    assert 2.5 < waited < 8


@pytest.mark.usefixtures("short_socket_timeout")
def test_wait_of_three_seconds_times_out_cleanly_not_with_a_socket_error(
    other_thread: OtherThread,
) -> None:
    holder = Lock("chunked", timeout=30)
    assert other_thread(holder.acquire)
    started = time.monotonic()
    assert not Lock("chunked", blocking_timeout=3).acquire()
    waited = time.monotonic() - started
    other_thread(holder.release)
    assert 2.9 < waited < 6


@pytest.mark.usefixtures("short_socket_timeout")
def test_async_wait_longer_than_the_socket_timeout_succeeds() -> None:
    import asyncio

    async def main() -> float:
        holds = asyncio.Event()

        async def hold_for_three_seconds() -> None:
            async with AsyncLock("chunked-async", timeout=30):
                holds.set()
                await asyncio.sleep(3.0)  # the holder's work

        holder = asyncio.create_task(hold_for_three_seconds())
        await asyncio.wait_for(holds.wait(), 10)
        started = time.monotonic()
        assert await AsyncLock("chunked-async", blocking_timeout=20).acquire()
        waited = time.monotonic() - started
        await holder
        return waited

    assert 2.5 < asyncio.run(main()) < 8
