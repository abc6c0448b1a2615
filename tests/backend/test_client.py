from __future__ import annotations

import io
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockBackendError, LockLostError
from django_redislock.backend import client as backend
from tests.settings import redis_cache
from tests.support.clients import LIB
from tests.support.other_holders import OtherThread
from tests.support.servers import RedisServer, free_port

SOCKET_TIMEOUT = 0.5
#: How soon an unreachable or hung server must be reported: a socket timeout,
#: redis-py's one retry and a loaded 2-core machine's scheduling (CI saw 1.65 s),
#: and still far below the 10 s a default acquire would otherwise wait.
REPORTED_WITHIN = 5 * SOCKET_TIMEOUT


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
    assert isinstance(info.value.__cause__, LIB.ConnectionError)
    assert info.value.name == "down"
    assert "unreachable" in str(info.value)
    assert elapsed < REPORTED_WITHIN


class PoolOfOurOwn(LIB.ConnectionPool):  # type: ignore[misc,name-defined]
    pass


def test_the_rig_never_takes_another_process_s_server_for_its_own(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """CI runs two test runs at once: a port picked free may be taken by the
    other run's server before ours binds it, and a PING answered there had the
    tests flush the other run's data. The rig moves to another port instead,
    and never moves a server that had started (its URL is in use)."""
    theirs = redis_server_factory()
    theirs.client().set("theirs", "1")
    ours = RedisServer()
    ours.port = theirs.port  # what a race with the other run looks like
    ours.start()
    try:
        assert ours.port != theirs.port
        assert ours.client().info("server")["process_id"] == ours.process.pid  # type: ignore[union-attr]
        assert theirs.client().get("theirs") == b"1"
    finally:
        ours.stop()
    with pytest.raises(RuntimeError, match="held by another server"):
        RedisServer(port=theirs.port).start()


def test_a_server_on_a_stopped_servers_port_gets_a_pool_of_its_own_settings(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """The rig's promise (``tests/support/servers.py``): django-redis keeps pools by URL
    alone, so a recycled free port must not hand a test the last test's pool."""
    first = redis_server_factory()
    with cache_at(first.url):
        assert type(backend.get_client("default").connection_pool) is LIB.ConnectionPool
    first.stop()
    second = RedisServer(port=first.port).start()
    try:
        with cache_at(second.url, CONNECTION_POOL_CLASS=f"{__name__}.PoolOfOurOwn"):
            assert type(backend.get_client("default").connection_pool) is PoolOfOurOwn
    finally:
        second.stop()


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
    assert isinstance(info.value.__cause__, LIB.TimeoutError | LIB.ConnectionError)
    assert elapsed < REPORTED_WITHIN


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
    assert isinstance(cause, LIB.TimeoutError | LIB.ConnectionError)
    assert elapsed < REPORTED_WITHIN


@pytest.fixture
def short_socket_timeout(redis_url: str) -> Iterator[None]:
    """django-redis with the 0.5 s socket timeout common in production."""
    with cache_at(redis_url, SOCKET_TIMEOUT=SOCKET_TIMEOUT):
        yield


@pytest.mark.usefixtures("short_socket_timeout")
def test_wait_longer_than_the_socket_timeout_succeeds() -> None:
    holds = threading.Event()
    held_at: list[float] = []

    def hold_for_three_seconds() -> None:
        with Lock("chunked", timeout=30):
            held_at.append(time.monotonic())  # measured here: this thread may wake late
            holds.set()
            time.sleep(3.0)  # the holder's work

    holder = threading.Thread(target=hold_for_three_seconds)
    holder.start()
    try:
        assert holds.wait(10)
        assert Lock("chunked", blocking_timeout=20).acquire()
        waited = time.monotonic() - held_at[0]
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

        held_at: list[float] = []

        async def hold_for_three_seconds() -> None:
            async with AsyncLock("chunked-async", timeout=30):
                held_at.append(time.monotonic())
                holds.set()
                await asyncio.sleep(3.0)  # the holder's work

        holder = asyncio.create_task(hold_for_three_seconds())
        await asyncio.wait_for(holds.wait(), 10)
        assert await AsyncLock("chunked-async", blocking_timeout=20).acquire()
        waited = time.monotonic() - held_at[0]
        await holder
        return waited

    assert 2.5 < asyncio.run(main()) < 8


# the cache's namespace: KEY_PREFIX and VERSION ------------------------------------------


def _two_sites(redis_url: str, **second: object) -> dict[str, object]:
    from tests.settings import redis_cache

    first = redis_cache(redis_url)
    first["KEY_PREFIX"] = "site1"
    other = redis_cache(redis_url)
    other.update(second)
    return {"default": redis_cache(redis_url), "site1": first, "site2": other}


@pytest.mark.parametrize("second", [{"KEY_PREFIX": "site2"}, {"KEY_PREFIX": "site1", "VERSION": 2}])
def test_caches_that_differ_only_in_prefix_or_version_never_share_a_lock(
    redis_url: str, redis_client: redis.Redis, second: dict[str, object]
) -> None:
    import json

    from django.core.management import call_command
    from django.test import override_settings

    with override_settings(CACHES=_two_sites(redis_url, **second)):
        one, two = Lock("sku:1", using="site1"), Lock("sku:1", using="site2")
        assert one.acquire(blocking=False)
        assert two.acquire(blocking=False)  # the same name, two sites: both held at once
        assert redis_client.exists("redislock:site1:1:{sku:1}:lock")
        version = second.get("VERSION", 1)
        assert redis_client.exists(f"redislock:{second['KEY_PREFIX']}:{version}:{{sku:1}}:lock")
        out = io.StringIO()
        call_command("locks", "--using", "site1", "--json", stdout=out)
        assert [row["name"] for row in json.loads(out.getvalue())] == ["sku:1"]
        out = io.StringIO()
        call_command("locks", "--using", "default", "--json", stdout=out)
        assert json.loads(out.getvalue()) == []  # the default cache sees neither
        call_command("locks", "--using", "site1", "clear", "--all", "--noinput", stdout=out)
        assert not one.locked()
        assert two.locked() and two.owned()  # the other site's lock stands
        two.release()
        with pytest.raises(LockLostError):
            one.release()


def test_a_cache_without_prefix_or_version_keeps_the_plain_keys(redis_client: redis.Redis) -> None:
    with Lock("plain"):
        assert redis_client.exists("redislock:{plain}:lock")


def test_a_cache_prefix_cannot_break_the_hash_tag_or_the_scan(
    redis_url: str, redis_client: redis.Redis
) -> None:
    from django.test import override_settings

    from django_redislock.ops import inspection

    caches = _two_sites(redis_url, KEY_PREFIX="we{ir}d*")
    with override_settings(CACHES=caches), Lock("n", using="site2"):
        assert redis_client.exists("redislock:we%7Bir%7Dd*:1:{n}:lock")
        prefix = backend.namespace("site2", "redislock")
        assert [h.name for h in inspection.list_held(redis_client, prefix)] == ["n"]


def test_threads_that_ask_for_a_cache_s_client_at_once_share_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each thread has its own Django cache object, so a client built by
    every thread that missed the cache at once was a client per thread; what
    is kept per client (a shared wake-up connection and its thread) was
    then kept twice. The first build waits a second for another to begin:
    one does only where the second thread does not wait for the first."""
    built: list[object] = []
    inside = threading.Event()
    another = threading.Event()

    def slow_build(alias: str) -> object:
        client = object()
        built.append(client)
        if inside.is_set():
            another.set()
        inside.set()
        another.wait(1)
        return client

    monkeypatch.setattr(backend, "_client_for", slow_build)
    cache = backend._ClientCache()
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("default")[0]))]
    threads[0].start()
    assert inside.wait(10)
    threads.append(threading.Thread(target=lambda: got.append(cache.get("default")[0])))
    threads[1].start()
    for thread in threads:
        thread.join(10)
    assert len(built) == 1
    assert got == [built[0], built[0]]
