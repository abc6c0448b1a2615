"""``blocking_timeout`` bounds an acquire even when Redis hangs mid-command.

A private ``redis-server`` is paused with SIGSTOP while an acquire's command
is on its way (docs/guarantees.md, "A Redis that stops answering"). The
acquire must end within its budget plus ``bounds.FLOOR`` (and the scheduling
slack of a busy machine), with ``LockBackendTimeout``; once the server is
resumed, the attempt Redis ran after the client gave up is undone by its
cancel script, sent by the janitor thread (a Lock is passed on, a permit given
back), and no queue entry is left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from django_redislock import (
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    Lock,
    LockBackendError,
    LockTimeout,
    ReadWriteLock,
    Semaphore,
    require_lock,
)
from django_redislock.backend import client as backend
from django_redislock.engine import bounds
from django_redislock.engine import janitor as janitor_module
from django_redislock.exceptions import LockBackendTimeout
from tests.settings import redis_cache
from tests.support.clients import LIB
from tests.support.other_holders import OtherThread
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("real_redis")]

BUDGET = 1.0
#: The documented slack, and a busy 2-core machine's scheduling on top of it.
LATE = bounds.FLOOR + 0.75
LEASE = 2.0
NAME = "hung"

SYNC: dict[str, Callable[..., Any]] = {
    "Lock": lambda **kw: Lock(NAME, timeout=LEASE, **kw),
    "Semaphore": lambda **kw: Semaphore(NAME, 1, timeout=LEASE, **kw),
    "ReadWriteLock": lambda **kw: ReadWriteLock(NAME, timeout=LEASE, **kw).write(),
}
ASYNC: dict[str, Callable[..., Any]] = {
    "Lock": lambda **kw: AsyncLock(NAME, timeout=LEASE, **kw),
    "Semaphore": lambda **kw: AsyncSemaphore(NAME, 1, timeout=LEASE, **kw),
    "ReadWriteLock": lambda **kw: AsyncReadWriteLock(NAME, timeout=LEASE, **kw).write(),
}
#: Key parts (after ``redislock:{hung}:``) of each primitive's holder and queue.
PARTS = {
    "Lock": ("lock", "queue"),
    "Semaphore": ("semaphore", "sem:queue"),
    "ReadWriteLock": ("rwlock", "rw:queue"),
}


class Pausable:
    """A private server that a test can freeze (SIGSTOP) and thaw (SIGCONT)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.client = server.client()
        assert server.process is not None
        self.pid = server.process.pid
        self.paused = False

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            os.kill(self.pid, signal.SIGCONT)
            self.paused = False

    def key(self, part: str) -> str:
        return f"redislock:{{{NAME}}}:{part}"


@pytest.fixture
def paused(redis_server_factory: Callable[..., RedisServer]) -> Iterator[Pausable]:
    server = Pausable(redis_server_factory())
    try:
        yield server
    finally:
        server.resume()
        assert janitor_module.janitor.wait_idle(15), "a clean-up was never delivered"
        server.client.close()


class OwnPool(LIB.ConnectionPool):  # type: ignore[misc,name-defined]
    """A pool class of the project's own, whose asyncio commands run on worker threads."""


def settings_for(server: Pausable, socket_timeout: float | None, *, own_pool: bool = False) -> Any:
    options: dict[str, object] = {
        "SOCKET_TIMEOUT": socket_timeout,
        "SOCKET_CONNECT_TIMEOUT": socket_timeout,
    }
    if own_pool:
        options["CONNECTION_POOL_CLASS"] = f"{__name__}.OwnPool"
    return override_settings(CACHES={"default": redis_cache(server.server.url, **options)})


def assert_on_time(started: float, error: BaseException) -> None:
    elapsed = time.monotonic() - started
    assert BUDGET - 0.05 <= elapsed <= BUDGET + LATE, elapsed
    assert isinstance(error, LockBackendTimeout)
    assert isinstance(error, LockTimeout) and isinstance(error, LockBackendError)
    assert error.name == NAME and error.retry_after is None
    cause = error.__cause__
    assert isinstance(cause, redis.TimeoutError)
    assert isinstance(cause.__cause__, redis.TimeoutError | TimeoutError | asyncio.TimeoutError)


def assert_nothing_left(server: Pausable, kind: str) -> None:
    """After the resume: the late attempt is undone (a lock passed on, a permit
    given back), no waiter is queued."""
    assert janitor_module.janitor.wait_idle(15), "a clean-up was never delivered"
    holders, queue = PARTS[kind]
    assert server.client.zcard(server.key(queue)) == 0
    ttl = server.client.pttl(server.key(holders))
    assert ttl == -2, f"the {kind} granted after the client gave up was not undone"


@pytest.mark.parametrize(
    ("socket_timeout", "own_pool"),
    [(None, False), (30.0, False), (None, True)],
    ids=["no-socket-timeout", "30s", "own-pool-class"],
)
@pytest.mark.parametrize("kind", list(SYNC))
def test_acquire_on_a_paused_redis_ends_at_its_blocking_timeout(
    paused: Pausable, kind: str, socket_timeout: float | None, own_pool: bool
) -> None:
    with settings_for(paused, socket_timeout, own_pool=own_pool):
        if own_pool:
            assert type(backend.get_client("default").connection_pool) is OwnPool
        warm = SYNC[kind](blocking_timeout=BUDGET)
        assert warm.acquire()  # a pooled connection for this budget, the scripts loaded
        warm.release()
        # a Lock's acquire is a plain SET (no fence taken): the server's count of them
        sets_before = paused.client.info("commandstats").get("cmdstat_set", {}).get("calls", 0)
        paused.pause()
        started = time.monotonic()
        with pytest.raises(LockBackendTimeout) as info:
            SYNC[kind](blocking_timeout=BUDGET).acquire()
        assert_on_time(started, info.value)
        started = time.monotonic()
        with pytest.raises(LockTimeout) as timeout, SYNC[kind](blocking_timeout=BUDGET):
            pytest.fail("acquired on a paused server")
        assert_on_time(started, timeout.value)
        paused.resume()
        assert_nothing_left(paused, kind)
        if kind == "Lock":  # the first late attempt (on a pooled connection) did run
            assert paused.client.info("commandstats")["cmdstat_set"]["calls"] > sets_before
        again = SYNC[kind](blocking_timeout=LEASE + 3)
        assert again.acquire()
        again.release()


@pytest.mark.parametrize("path", ["native", "fallback"])
@pytest.mark.parametrize("kind", list(ASYNC))
def test_async_acquire_on_a_paused_redis_ends_at_its_blocking_timeout(
    paused: Pausable, kind: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "fallback":  # no asyncio mirror (Sentinel, Cluster): a worker thread
        monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda c: None)

    async def main() -> None:
        warm = ASYNC[kind](blocking_timeout=BUDGET)
        assert await warm.acquire()
        await warm.release()
        paused.pause()
        started = time.monotonic()
        with pytest.raises(LockBackendTimeout) as info:
            await ASYNC[kind](blocking_timeout=BUDGET).acquire()
        assert_on_time(started, info.value)
        started = time.monotonic()
        with pytest.raises(LockTimeout) as timeout:
            async with ASYNC[kind](blocking_timeout=BUDGET):
                pytest.fail("acquired on a paused server")
        assert_on_time(started, timeout.value)
        paused.resume()
        await asyncio.to_thread(assert_nothing_left, paused, kind)
        again = ASYNC[kind](blocking_timeout=LEASE + 3)
        assert await again.acquire()
        await again.release()

    with settings_for(paused, None):
        asyncio.run(main())


def wait_for_late_nest(server: Pausable) -> None:
    """Until the resumed server has run the nest the client gave up on: the
    lock's count (``<token>:<waiters>:<count>:...``) reads 2."""
    deadline = time.monotonic() + 10
    while server.client.get(server.key("lock")).split(b":")[2] != b"2":
        assert time.monotonic() < deadline, "the nest sent before the pause never ran"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_nested_acquire_on_a_paused_redis_ends_at_its_blocking_timeout(
    paused: Pausable, mode: str
) -> None:
    """A reentrant acquire is bounded like a first one; if Redis counts it after
    the client gave up, the holder's one release still frees the lock."""
    held = 30.0  # no renewal falls into the pause

    async def nest_async() -> None:
        async with AsyncLock(NAME, timeout=held), AsyncLock(NAME, timeout=held):
            pass  # the acquire script loaded, by a nest (a first acquire is a plain SET now)
        outer = AsyncLock(NAME, timeout=held)
        assert await outer.acquire()
        paused.pause()
        started = time.monotonic()
        with pytest.raises(LockBackendTimeout) as info:
            await AsyncLock(NAME, timeout=held, blocking_timeout=BUDGET).acquire()
        assert_on_time(started, info.value)
        paused.resume()
        await asyncio.to_thread(wait_for_late_nest, paused)
        await outer.release()

    with settings_for(paused, None):
        if mode == "async":
            asyncio.run(nest_async())
        else:
            # a pooled connection for this budget (connecting would be the hang), and
            # the acquire script loaded by a nest (a first acquire is a plain SET now)
            with Lock(NAME, timeout=held, blocking_timeout=BUDGET):
                with Lock(NAME, timeout=held, blocking_timeout=BUDGET):
                    pass
            outer = Lock(NAME, timeout=held)
            assert outer.acquire()
            paused.pause()
            started = time.monotonic()
            with pytest.raises(LockBackendTimeout) as info:
                Lock(NAME, timeout=held, blocking_timeout=BUDGET).acquire()
            assert_on_time(started, info.value)
            paused.resume()
            wait_for_late_nest(paused)
            outer.release()
    assert paused.client.pttl(paused.key("lock")) == -2  # freed, not held for the lease


def test_require_lock_on_a_paused_redis_answers_503_at_its_blocking_timeout(
    paused: Pausable,
) -> None:
    @require_lock("view:{pk}", blocking_timeout=BUDGET)
    def view(request: Any, pk: int) -> HttpResponse:
        return HttpResponse("ran")

    with settings_for(paused, None):
        assert view(RequestFactory().get("/"), pk=1).status_code == 200
        paused.pause()
        started = time.monotonic()
        response = view(RequestFactory().get("/"), pk=1)
        elapsed = time.monotonic() - started
        paused.resume()
    assert response.status_code == 503
    assert elapsed <= BUDGET + LATE, elapsed


def _pause_once_queued(server: Pausable, kind: str) -> threading.Thread:
    """Pause the server as soon as a waiter is queued (it is then in its BLPOP)."""

    def watch() -> None:
        deadline = time.monotonic() + 10
        while server.client.zcard(server.key(PARTS[kind][1])) == 0:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.005)
        server.pause()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["sync", "async", "sync-own-pool-class"])
@pytest.mark.parametrize("kind", list(SYNC))
def test_a_waiter_on_a_redis_paused_mid_wait_ends_at_its_blocking_timeout(
    paused: Pausable, kind: str, mode: str
) -> None:
    asynchronous = mode == "async"
    holder_thread = OtherThread()
    with settings_for(paused, None, own_pool=mode.endswith("own-pool-class")):
        holder = SYNC[kind]()
        try:
            assert holder_thread(holder.acquire, blocking=False)
            pauser = _pause_once_queued(paused, kind)
            started = time.monotonic()
            with pytest.raises(LockBackendTimeout) as info:
                if asynchronous:
                    asyncio.run(ASYNC[kind](blocking_timeout=BUDGET).acquire())
                else:
                    SYNC[kind](blocking_timeout=BUDGET).acquire()
            pauser.join(1)
            assert paused.paused, "the server was not paused while the waiter waited"
            assert_on_time(started, info.value)
            paused.resume()
            assert janitor_module.janitor.wait_idle(15)
            assert paused.client.zcard(paused.key(PARTS[kind][1])) == 0, "the waiter stayed queued"
            holder_thread(holder.release)
        finally:
            paused.resume()
            holder_thread.close()
        assert paused.client.pttl(paused.key(PARTS[kind][0])) == -2


def test_single_run_on_a_paused_redis_is_a_failed_run_not_already_running(
    paused: Pausable,
) -> None:
    """A hung Redis's ``LockBackendTimeout`` is a ``LockTimeout`` too; a cron
    wrapper must not read it as status 75, "skipped" (found by a review)."""
    from django.core.management.base import BaseCommand, CommandError

    from django_redislock import single_run

    class Nightly(BaseCommand):
        @single_run("nightly", blocking_timeout=BUDGET)
        def handle(self, *args: Any, **options: Any) -> None:
            raise AssertionError("must not run")

    with settings_for(paused, None):
        warm = Lock("warm", blocking_timeout=BUDGET)
        assert warm.acquire()  # a pooled connection for this budget, the scripts loaded
        warm.release()
        paused.pause()
        with pytest.raises(CommandError) as info:
            Nightly().handle()
        paused.resume()
    assert info.value.returncode == 1
    assert isinstance(info.value.__cause__, LockBackendTimeout)


def test_a_paused_server_holding_every_worker_delays_no_acquire_elsewhere(
    paused: Pausable, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """Commands on pools with no sibling (Sentinel, Cluster, a pool class of
    one's own) run on worker threads; one left on a paused server with no
    socket timeout keeps its worker. The workers were one set for every
    server: once a paused server held them all, every bounded acquire on
    the healthy ones timed out too (and an async fallback's commands,
    releases included, queued behind them for as long)."""
    healthy = redis_server_factory()
    options = {"SOCKET_TIMEOUT": None, "CONNECTION_POOL_CLASS": f"{__name__}.OwnPool"}
    caches = {
        "default": redis_cache(paused.server.url, **options),
        "healthy": redis_cache(healthy.url, **options),
    }
    with override_settings(CACHES=caches):
        for alias in caches:  # a pooled connection each, the scripts loaded
            with Lock(NAME, timeout=LEASE, using=alias, blocking_timeout=BUDGET):
                pass
        paused.pause()
        errors: list[BaseException] = []

        def stuck() -> None:
            try:
                Lock(NAME, timeout=LEASE, blocking_timeout=BUDGET).acquire()
            except LockBackendError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=stuck) for _ in range(bounds.MAX_WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(errors) == bounds.MAX_WORKERS  # each left its worker on the paused server
        elsewhere = Lock("elsewhere", timeout=LEASE, using="healthy", blocking_timeout=BUDGET)
        assert elsewhere.acquire(), "the healthy server's acquire waited on the paused one"
        elsewhere.release()
        paused.resume()


def test_a_clean_up_for_a_paused_server_delays_none_for_another(
    paused: Pausable, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """The janitor sends clean-ups one after another; on a pool with no
    sibling it sent them on the cache's own client, which with no socket
    timeout waited on a paused server for as long as it stayed paused, and
    no clean-up for any other server was sent meanwhile."""
    from django_redislock.engine.steps import Call

    healthy = redis_server_factory()
    options = {"SOCKET_TIMEOUT": None, "CONNECTION_POOL_CLASS": f"{__name__}.OwnPool"}
    caches = {
        "default": redis_cache(paused.server.url, **options),
        "healthy": redis_cache(healthy.url, **options),
    }
    delivered = threading.Event()

    def ping(client: Any, keys: Any, args: Any) -> None:
        client.ping()

    def ping_and_tell(client: Any, keys: Any, args: Any) -> None:
        client.ping()
        delivered.set()

    with override_settings(CACHES=caches):
        stuck, elsewhere = backend.get_client("default"), backend.get_client("healthy")
        stuck.ping()  # a pooled connection, to the server about to be paused
        paused.pause()
        janitor_module.janitor.submit(stuck, Call(ping, [], []))
        janitor_module.janitor.submit(elsewhere, Call(ping_and_tell, [], []))
        assert delivered.wait(10), "the other server's clean-up waited on the paused one"
        paused.resume()


def test_a_paused_server_holding_every_wait_thread_delays_no_async_waiter_elsewhere(
    paused: Pausable,
    redis_server_factory: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio fallback (no asyncio mirror: Sentinel, a pool class of
    one's own) runs its reads on worker threads, a set per server
    (``bounds.workers``), and its waits on the shared wake-up connection of
    their server. Once the threads were one set for every server: reads on a
    paused server with no socket timeout held them all, a waiter on a healthy
    server never got a thread for its ``BLPOP``, and slept through the release
    that handed it the lock (and its reads queued as long)."""
    from django_redislock.engine import bounds

    monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda c: None)
    healthy = redis_server_factory()
    own_pool = f"{__name__}.OwnPool"
    caches = {
        "default": redis_cache(
            paused.server.url, SOCKET_TIMEOUT=None, CONNECTION_POOL_CLASS=own_pool
        ),
        # a short socket timeout bounds a wait already: it runs on the wait threads
        "healthy": redis_cache(healthy.url, SOCKET_TIMEOUT=0.5, CONNECTION_POOL_CLASS=own_pool),
    }
    holder_thread = OtherThread()

    async def main() -> None:
        for alias in caches:  # a pooled connection each, the scripts loaded
            async with AsyncLock(NAME, timeout=LEASE, using=alias, blocking_timeout=BUDGET):
                pass
        paused.pause()
        stuck = [asyncio.create_task(AsyncLock(NAME).locked()) for _ in range(bounds.MAX_WORKERS)]
        deadline = time.monotonic() + 30
        while bounds.workers.workers() < bounds.MAX_WORKERS:
            assert time.monotonic() < deadline, "the reads never took every wait thread"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # each is in its read, on the paused server
        assert not any(task.done() for task in stuck)

        assert not await asyncio.wait_for(AsyncLock("elsewhere", using="healthy").locked(), 5)
        holder = Lock("elsewhere", timeout=10, using="healthy")
        assert holder_thread(holder.acquire, blocking=False)

        async def wait_and_release() -> bool:
            waiter = AsyncLock("elsewhere", timeout=10, using="healthy", blocking_timeout=20)
            if not await waiter.acquire():
                return False
            await waiter.release()
            return True

        waiting = asyncio.create_task(wait_and_release())
        queue = "redislock:{elsewhere}:queue"
        while not await asyncio.to_thread(healthy.client().zcard, queue):
            assert time.monotonic() < deadline, "the waiter never queued"
            await asyncio.sleep(0.01)
        holder_thread(holder.release)
        released = time.monotonic()
        assert await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - released < 3, "the waiter waited on the paused server's threads"

        paused.resume()
        assert await asyncio.wait_for(asyncio.gather(*stuck), 30) == [False] * len(stuck)

    try:
        with override_settings(CACHES=caches):
            asyncio.run(main())
    finally:
        paused.resume()
        holder_thread.close()


@pytest.mark.parametrize("path", ["native", "fallback"])
@pytest.mark.parametrize("kind", list(ASYNC))
def test_an_asyncio_timeout_ends_an_unbounded_acquire_on_a_paused_redis(
    paused: Pausable, kind: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``asyncio.timeout`` around an acquire cancels it; the clean-up that
    follows (the attempt undone) is shielded. On the asyncio mirror it was
    bounded only by what was left of the ``blocking_timeout`` (here the
    default, 10 s; with ``BLOCKING_TIMEOUT: None``, not at all): with no
    socket timeout, on a paused server the ``asyncio.timeout`` of 1 s ended
    after 10 s. The clean-up now waits ``CLEANUP_TIMEOUT`` at most, then is
    the janitor's."""
    if path == "fallback":
        monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda c: None)

    async def main() -> float:
        warm = ASYNC[kind](blocking_timeout=BUDGET)
        assert await warm.acquire()  # a pooled connection, the scripts loaded
        await warm.release()
        paused.pause()
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            if sys.version_info >= (3, 11):
                async with asyncio.timeout(BUDGET):
                    await ASYNC[kind](blocking_timeout=None).acquire()
            else:  # the same cancellation, of a task of its own
                await asyncio.wait_for(ASYNC[kind](blocking_timeout=None).acquire(), BUDGET)
        return time.monotonic() - started

    with settings_for(paused, None):
        try:
            elapsed = asyncio.run(asyncio.wait_for(main(), 30))
        finally:
            paused.resume()
        assert elapsed <= BUDGET + janitor_module.CLEANUP_TIMEOUT + LATE, elapsed
        assert_nothing_left(paused, kind)
