"""Waiting at scale (``engine/wakeups.py``): a process's waiters share one
wake-up connection per server, with real processes and real servers.

A waiter once held a pool connection for its whole ``BLPOP``: past about
100 waiters per process redis-py's pool ran dry and a healthy, idle Redis was
reported unreachable (503). Each test here holds a name from the test process
and lets waiters in other processes queue behind it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockBackendError, LockTimeout
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread
from tests.support.procs import CTX, processes, start_one
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.usefixtures("real_redis")]

#: A long first wait (the re-check fallback): an acquire well before it came
#: from a wake-up delivered by the shared connection, not from a re-check.
LONG_RECHECK = 10.0


def _queued(client: redis.Redis, name: str) -> int:
    return int(client.zcard(f"redislock:{{{name}}}:queue"))


def _until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _crowd(url: str, name: str, threads: int, cap: int, results: Any) -> None:
    """A process of ``threads`` waiters on ``name``, its pool capped at ``cap``:
    each acquires once, checks it is alone, and reports."""
    caches = {
        "default": redis_cache(
            f"{url}?client_name=crowd", CONNECTION_POOL_KWARGS={"max_connections": cap}
        )
    }
    with override_settings(CACHES=caches):
        from django_redis import get_redis_connection

        client = get_redis_connection("default")
        # The check that a holder is alone goes over a pool of its own: the
        # claim is the library's use of the capped pool. (The waiters' re-checks
        # can take that whole pool for a moment, a chunk after they queued
        # together; a command of the holder's own on it then met redis-py's
        # MaxConnectionsError in a CI run.)
        inside = redis.Redis.from_url(url)
        outcomes: list[str] = []
        mutex = threading.Lock()

        def one() -> None:
            try:
                with Lock(name, timeout=30, blocking_timeout=120):
                    alone = inside.incr(f"{name}:inside") == 1
                    inside.decr(f"{name}:inside")
                    outcome = "acquired" if alone else "overlap"
            except LockBackendError as exc:
                outcome = f"error: {exc}"
            except LockTimeout:
                outcome = "timeout"
            except Exception as exc:  # reported, not lost with its thread
                outcome = f"error: {exc!r}"
            with mutex:
                outcomes.append(outcome)

        workers = [threading.Thread(target=one) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(180)
        opened = client.connection_pool._created_connections
        results.put((os.getpid(), outcomes, opened))


def test_thousands_of_waiters_in_a_few_processes_share_one_connection_each(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """1,200 waiters in 3 processes, each pool capped at 20 connections: Redis
    sees at most one blocked client per process while all of them wait, and
    every waiter gets the lock, alone, with no backend error."""
    name, per_process, cap = "crowd", 400, 20
    results = CTX.Queue()
    holder_thread = OtherThread()
    holder = Lock(name, timeout=120)
    assert holder_thread(holder.acquire, blocking=False)
    blocked: list[int] = []
    try:
        with processes(_crowd, [(redis_url, name, per_process, cap, results)] * 3, timeout=240):
            _until(lambda: _queued(redis_client, name) == 3 * per_process, "never all queued")
            for _ in range(10):
                blocked.append(
                    sum(
                        c["name"] == "crowd" and "b" in c["flags"]
                        for c in redis_client.client_list()
                    )
                )
                time.sleep(0.05)
            holder_thread(holder.release)
            reports = [results.get(timeout=240) for _ in range(3)]
    finally:
        holder_thread.close()
    assert max(blocked) <= 3, blocked  # one shared wake-up connection per process
    for _pid, outcomes, opened in reports:
        assert outcomes == ["acquired"] * per_process, sorted(set(outcomes))
        assert opened <= cap
    assert _queued(redis_client, name) == 0


class Freezable:
    """A private server to pause (SIGSTOP) and restart on its port."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        assert server.process is not None

    def pause(self) -> None:
        assert self.server.process is not None
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.server.process is not None
        os.kill(self.server.process.pid, signal.SIGCONT)


@pytest.fixture
def private(redis_server_factory: Callable[..., RedisServer]) -> Iterator[Freezable]:
    server = Freezable(redis_server_factory())
    try:
        yield server
    finally:
        server.resume()


def _waiters(url: str, name: str, count: int, socket_timeout: float, results: Any) -> None:
    """``count`` waiters on ``name`` of the server at ``url``; each reports
    how it ended and when (``time.time``, comparable across processes)."""
    caches = {"default": redis_cache(url, SOCKET_TIMEOUT=socket_timeout)}
    with override_settings(CACHES=caches):
        from django_redis import get_redis_connection

        client = get_redis_connection("default")

        def one() -> None:
            try:
                with Lock(name, timeout=30, blocking_timeout=60):
                    alone = client.incr(f"{name}:inside") == 1
                    client.decr(f"{name}:inside")
                    results.put(("acquired" if alone else "overlap", time.time()))
            except LockBackendError as exc:
                results.put((f"error: {type(exc.__cause__).__name__}", time.time()))
            except LockTimeout:
                results.put(("timeout", time.time()))

        workers = [threading.Thread(target=one) for _ in range(count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)


def test_a_server_paused_while_they_wait_serves_them_all_once_it_resumes(
    private: Freezable,
) -> None:
    """Paused for longer than a wake-up connection's ``BLPOP`` (2 s of a 5 s
    socket timeout), the server stalls the waiters only: once it resumes,
    the shared connection takes up again, and every waiter gets the lock."""
    name, count = "paused-wait", 20
    url = private.server.url
    probe = private.server.client()
    results = CTX.Queue()
    holder_thread = OtherThread()
    try:
        with override_settings(CACHES={"default": redis_cache(url)}):
            holder = Lock(name, timeout=60)
            assert holder_thread(holder.acquire, blocking=False)
            with processes(_waiters, [(url, name, count, 5.0, results)], timeout=120):
                _until(lambda: _queued(probe, name) == count, "the waiters never queued")
                private.pause()
                time.sleep(2.5)  # the fault itself: the BLPOP under way outlives its wait
                private.resume()
                holder_thread(holder.release)
                outcomes = [results.get(timeout=60)[0] for _ in range(count)]
    finally:
        private.resume()
        holder_thread.close()
    assert outcomes == ["acquired"] * count


def test_a_server_restarted_while_they_wait_wakes_them_again(private: Freezable) -> None:
    """Redis restarted (empty) under 20 waiters: the shared connection
    reconnects, none of them sees two holders, each ends held or with a
    backend error of the outage itself, and a release after the restart still
    wakes the next waiter at once (through the new wake-up connection, well
    before its re-check)."""
    name, count = "restarted-wait", 20
    url = private.server.url
    probe = private.server.client()
    results = CTX.Queue()
    holder_thread = OtherThread()
    try:
        with override_settings(CACHES={"default": redis_cache(url)}):
            holder = Lock(name, timeout=120)
            assert holder_thread(holder.acquire, blocking=False)
            with processes(_waiters, [(url, name, count, 5.0, results)], timeout=120):
                _until(lambda: _queued(probe, name) == count, "the waiters never queued")
                private.server.restart()  # the lease is gone: the first re-check takes it
                outcomes = [results.get(timeout=60)[0] for _ in range(count)]
            with processes(_waiters, [(url, name, 1, 5.0, results)], timeout=60):
                assert holder_thread(holder.acquire, blocking=False)  # a new hold, after it
                _until(lambda: _queued(probe, name) == 1, "the late waiter never queued")
                holder_thread(holder.release)
                released = time.time()
                late, at = results.get(timeout=30)
    finally:
        holder_thread.close()
    assert "overlap" not in outcomes
    assert all(o == "acquired" or o.startswith("error") for o in outcomes), outcomes
    assert outcomes.count("acquired") >= count // 2, outcomes
    assert late == "acquired"
    assert at - released < 1.5, "the release after the restart did not wake its waiter"


def _give_up_early(url: str, name: str, results: Any) -> None:
    """Two waiters behind the test's hold: one gives up (a timeout in a
    thread, a cancelled task), one waits on; both while the shared
    connection's BLPOP is under way with their keys."""
    import django_redislock.backend.client as backend

    backend.MAX_WAIT_CHUNK = LONG_RECHECK  # so a wake-up shows against a re-check
    from django_redislock.engine.wakeups import wakeups

    with override_settings(CACHES={"default": redis_cache(url)}):

        async def main() -> None:
            async def patient() -> float:
                async with AsyncLock(name, timeout=30, blocking_timeout=60):
                    return time.time()

            async def impatient() -> None:
                async with AsyncLock(name, timeout=30, blocking_timeout=60):
                    raise AssertionError("the cancelled waiter acquired")

            timed_out: list[bool] = []

            def short() -> None:
                timed_out.append(not Lock(name, timeout=30, blocking_timeout=1).acquire())

            thread = threading.Thread(target=short)
            thread.start()
            await asyncio.sleep(0.3)
            cancelled = asyncio.create_task(impatient())
            await asyncio.sleep(0.3)
            waiting = asyncio.create_task(patient())
            await asyncio.sleep(0.5)
            cancelled.cancel()
            await asyncio.gather(cancelled, return_exceptions=True)
            await asyncio.to_thread(thread.join, 30)
            left = wakeups.waiters()
            results.put(("gave up", timed_out == [True], left))
            results.put(("acquired", await waiting))

        asyncio.run(main())


def test_a_waiter_that_gives_up_while_the_shared_connection_waits_passes_nothing_on(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A waiter that timed out (a thread) and one that was cancelled (a task)
    while the shared ``BLPOP`` listed their keys: they leave the queue and
    the shared connection, and the release that follows wakes the waiter
    behind them at once, long before its re-check."""
    name = "gives-up"
    results = CTX.Queue()
    holder_thread = OtherThread()
    holder = Lock(name, timeout=60)
    assert holder_thread(holder.acquire, blocking=False)
    try:
        with processes(_give_up_early, [(redis_url, name, results)], timeout=90):
            kind, timed_out, left = results.get(timeout=60)
            assert (kind, timed_out) == ("gave up", True)
            assert left <= 1  # at most the patient one is listened for
            _until(lambda: _queued(redis_client, name) == 1, "stale waiters stayed in line")
            holder_thread(holder.release)
            released = time.time()
            kind, at = results.get(timeout=30)
    finally:
        holder_thread.close()
    assert kind == "acquired"
    assert at - released < LONG_RECHECK / 2, "woken by its re-check, not by the release"


def _fork_while_waiting(url: str, name: str, child_name: str, results: Any) -> None:
    """Wait on ``name`` in a thread (the shared connection runs), fork, and
    in the child wait on ``child_name``: the child's waiter must be woken by a
    wake-up connection of its own (its parent's thread is not in it)."""
    import django_redislock.backend.client as backend

    backend.MAX_WAIT_CHUNK = LONG_RECHECK
    with override_settings(CACHES={"default": redis_cache(url)}):
        acquired: list[float] = []
        parent_waiter = threading.Thread(
            target=lambda: acquired.append(
                time.time() if Lock(name, timeout=30, blocking_timeout=60).acquire() else 0.0
            )
        )
        parent_waiter.start()
        time.sleep(0.5)  # queued, its wake-up connection blocked
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's report is the pipe
            os.close(read)
            try:
                got = Lock(child_name, timeout=30, blocking_timeout=60).acquire()
                os.write(write, f"{int(got)} {time.time()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        results.put(("forked", pid))
        report = os.read(read, 100).decode()
        os.waitpid(pid, 0)
        # told at once: the test releases the parent's name only after this
        # report (put after the join, both waited out the join's 60 s)
        results.put(("child", report))
        parent_waiter.join(60)
        results.put(("parent", list(acquired)))


def test_fork_while_waiting_gives_the_child_a_wake_up_connection_of_its_own(
    redis_url: str, redis_client: redis.Redis
) -> None:
    name, child_name = "fork-parent", "fork-child"
    results: multiprocessing.Queue[Any] = CTX.Queue()
    holders = {n: Lock(n, timeout=60) for n in (name, child_name)}
    thread = OtherThread()
    for lock in holders.values():
        assert thread(lock.acquire, blocking=False)
    worker = start_one(_fork_while_waiting, redis_url, name, child_name, results)
    try:
        assert results.get(timeout=60)[0] == "forked"
        _until(lambda: _queued(redis_client, child_name) == 1, "the child never queued")
        thread(holders[child_name].release)
        released = time.time()
        kind, report = results.get(timeout=60)
        got, at = report.split()
        assert (kind, got) == ("child", "1")
        assert float(at) - released < LONG_RECHECK / 2, "the child was woken by its re-check"
        thread(holders[name].release)
        released = time.time()
        kind, acquired = results.get(timeout=60)
        assert kind == "parent" and acquired and acquired[0] - released < LONG_RECHECK / 2
    finally:
        thread.close()
        worker.join(30)
        if worker.is_alive():
            worker.kill()
    assert worker.exitcode == 0
