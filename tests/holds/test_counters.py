from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockLostError
from django_redislock.engine import bounds
from django_redislock.engine import workers as daemons
from django_redislock.holds import counters
from django_redislock.ops.inspection import stats
from tests.settings import redis_cache
from tests.support.clients import CLIENT
from tests.support.other_holders import OtherThread
from tests.support.procs import worker_env
from tests.support.servers import RedisServer, free_port
from tests.support.threads import refuse_threads

STATS_KEY = "redislock:{%s}:stats"


def counters_of(client: redis.Redis, name: str) -> dict[str, int]:
    """The name's counters, as ``manage.py locks`` reads them (this process's flushed first)."""
    return stats(client, "redislock", [name])[0]


def test_acquisitions_are_counted_once_per_outermost_acquire(redis_client: redis.Redis) -> None:
    lock = Lock("sku:1")
    for _ in range(3):
        with lock:
            with lock:  # nesting is not another acquisition
                pass
    assert counters_of(redis_client, "sku:1") == {"acquired": 3}
    ttl = redis_client.pttl(STATS_KEY % "sku:1")
    assert 3_600_000 - 60_000 < ttl <= 3_600_000  # STATS = True: an hour


def test_contention_and_wait_time(redis_client: redis.Redis, other_thread: OtherThread) -> None:
    holder = Lock("hot", auto_renew=False)
    holder.acquire()
    assert not other_thread(Lock("hot").acquire, blocking=False)
    queued = threading.Event()
    done = threading.Event()

    def wait() -> None:
        lock = Lock("hot", blocking_timeout=30)
        queued.set()
        assert lock.acquire()
        lock.release()
        done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    queued.wait(5)
    client = redis_client
    deadline = time.monotonic() + 10
    while not client.exists("redislock:{hot}:queue"):  # the waiter has queued
        assert time.monotonic() < deadline, "the waiter never queued"
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)  # lets the waiter accumulate measurable wait time
    holder.release()
    assert done.wait(10)
    thread.join(5)
    found = counters_of(redis_client, "hot")
    # the refused try and the waiter's first refusal; the waiter's re-checks are not counted again
    assert found["contended"] == 2
    assert found["acquired"] == 2
    assert found["waited"] == 1  # the waiter, not the refused try: wait_ms averages over it
    assert found["wait_ms"] >= 150


def test_lost_leases_are_counted(redis_client: redis.Redis) -> None:
    lock = Lock("gone", auto_renew=False)
    lock.acquire()
    redis_client.delete("redislock:{gone}:lock")
    with pytest.raises(LockLostError):
        lock.release()
    assert counters_of(redis_client, "gone") == {"acquired": 1, "lost": 1}


def test_counting_off_writes_nothing(redis_client: redis.Redis, other_thread: OtherThread) -> None:
    with override_settings(REDISLOCK={"STATS": False}):
        holder = Lock("quiet", auto_renew=False)
        holder.acquire()
        assert not other_thread(Lock("quiet").acquire, blocking=False)
        redis_client.delete("redislock:{quiet}:lock")
        with pytest.raises(LockLostError):
            holder.release()
    counters.flush()
    assert not redis_client.exists(STATS_KEY % "quiet")


@pytest.fixture
def tally(monkeypatch: pytest.MonkeyPatch) -> Iterator[counters.Tally]:
    """A tally of this test's own, written only when the test flushes it;
    forgotten after the test (its exit handler would write counts some tests
    leave with stand-in clients)."""
    own = counters.Tally(background=False)
    monkeypatch.setattr("django_redislock.holds.counters.acquired", own.acquired)
    monkeypatch.setattr("django_redislock.holds.counters.flush", own.flush)
    yield own
    own.reset()


@pytest.mark.parametrize("enabled", [True, False])
def test_uncontended_cycles_run_no_counter_command(tally: counters.Tally, enabled: bool) -> None:
    """'acquired' is counted by the client: the scripts run no HINCRBY on the
    free path, and a flush writes many acquires of a name as one HINCRBY.

    On a server of its own: the suite's is shared with other processes some
    tests start, whose background writes (HINCRBY, EXPIRE) landed in this
    count once."""
    lock = Lock("cost", auto_renew=False)
    with (
        RedisServer() as private,
        override_settings(
            CACHES={"default": redis_cache(private.url)}, REDISLOCK={"STATS": enabled}
        ),
    ):
        redis_client = redis.Redis.from_url(private.url)
        lock.acquire()
        lock.release()  # scripts loaded
        tally.flush()
        redis_client.config_resetstat()
        for _ in range(20):
            lock.acquire()
            lock.release()
        found = redis_client.info("commandstats")
        assert "cmdstat_hincrby" not in found and "cmdstat_pexpire" not in found
        # still one round trip per acquire (a plain SET NX PX) and per release
        assert found["cmdstat_set"]["calls"] == 20
        assert found["cmdstat_evalsha"]["calls"] == 20
        tally.flush()
        found = redis_client.info("commandstats")
        # the name's ``acquired``, and its minute's ``acquired`` and ``w0`` in the same pipeline
        assert found.get("cmdstat_hincrby", {}).get("calls", 0) == (3 if enabled else 0)
        if enabled:
            assert counters_of(redis_client, "cost") == {"acquired": 21}
            assert 3_600_000 - 60_000 < redis_client.pttl(STATS_KEY % "cost") <= 3_600_000
        else:
            assert not redis_client.exists(STATS_KEY % "cost")
        redis_client.close()


def test_async_acquisitions_are_counted(redis_client: redis.Redis) -> None:
    async def main() -> None:
        for _ in range(2):
            async with AsyncLock("async-counted"):
                pass

    asyncio.run(main())
    assert counters_of(redis_client, "async-counted") == {"acquired": 2}


def test_counts_reach_redis_within_a_second_unasked(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's writing thread flushes by itself; nobody calls flush here."""
    monkeypatch.setattr(
        "django_redislock.holds.counters.TALLY.background", True
    )  # the tests' conftest turns it off
    with Lock("unasked"):
        pass
    deadline = time.monotonic() + 10 * counters.FLUSH_SECONDS
    while not redis_client.exists(STATS_KEY % "unasked"):
        assert time.monotonic() < deadline, "the counts were never written"
        threading.Event().wait(0.05)
    assert counters_of(redis_client, "unasked") == {"acquired": 1}


def test_a_process_writes_its_counts_when_it_exits(redis_client: redis.Redis) -> None:
    """A short-lived process (a cron job, a management command) keeps its counts."""
    code = (
        "from tests.support.procs import setup_worker; import os, sys\n"
        "setup_worker(dict(os.environ))\n"
        "from django_redislock import Lock\n"
        "for _ in range(5):\n"
        "    with Lock('exiting'):\n"
        "        pass\n"
    )
    env = {**os.environ, **worker_env()}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert counters_of(redis_client, "exiting") == {"acquired": 5}


#: A process on a pool with no plain sibling (Cluster, Sentinel, a class of
#: its own) and a socket timeout over ``WRITE_TIMEOUT``: its writes are
#: bounded by waiting on another thread. At exit Python refuses new worker
#: threads (and 3.12 any new thread): before, its last counts were dropped.
OWN_POOL_EXIT = """\
import os, sys, time
os.environ.update(DJANGO_SETTINGS_MODULE="tests.settings")
from django.conf import settings
timeout = {timeout}
settings.CACHES["default"]["OPTIONS"].update(
    CONNECTION_POOL_CLASS="tests.engine.test_hung_server.OwnPool",
    SOCKET_TIMEOUT=timeout, SOCKET_CONNECT_TIMEOUT=timeout,
    # None given, not left out: redis-py 8 takes one left out as 5 s
    CONNECTION_POOL_KWARGS=dict(socket_timeout=timeout, socket_connect_timeout=timeout),
)
from tests.support.procs import setup_worker
setup_worker(dict(os.environ))
from django_redislock import Lock
for _ in range(5):
    with Lock("exiting-own-pool"):
        pass
if {freeze}:  # the server stops answering: an acquire gives up, and the process exits
    import signal
    from django_redislock import LockBackendTimeout
    os.kill({freeze}, signal.SIGSTOP)
    try:
        Lock("exiting-own-pool", blocking_timeout=0.5).acquire()
    except LockBackendTimeout:
        pass  # its command is still waiting for Redis, on a worker thread
    else:
        sys.exit("acquired on a frozen server")
print(time.monotonic(), flush=True)
"""


@pytest.mark.parametrize("timeout", [5, None], ids=["5s", "no-socket-timeout"])
def test_a_process_on_a_pool_of_its_own_writes_its_counts_when_it_exits(
    redis_client: redis.Redis, timeout: float | None
) -> None:
    redis_client.delete(STATS_KEY % "exiting-own-pool")
    code = OWN_POOL_EXIT.format(timeout=timeout, freeze=0)
    env = {**os.environ, **worker_env()}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert counters_of(redis_client, "exiting-own-pool") == {"acquired": 5}
    minutes = list(redis_client.scan_iter(match="redislock:{~hot}:minute:*"))
    history = [redis_client.hget(k, "exiting-own-pool\x1facquired") for k in minutes]
    assert sum(int(n or 0) for n in history) == 5


def own_pool_client(url: str) -> redis.Redis:
    """A client on a pool with no plain sibling and no socket timeout: its
    bounded writes wait on a worker thread."""
    from tests.engine.test_hung_server import OwnPool

    pool = OwnPool.from_url(url, socket_timeout=None, socket_connect_timeout=None)
    return CLIENT(connection_pool=pool)  # type: ignore[no-any-return]


def test_the_last_write_needs_no_new_thread(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At exit (``close``) the writing thread makes the last write itself:
    Python 3.12 starts no thread there, and no bounded worker runs yet."""
    monkeypatch.setattr("django_redislock.engine.bounds.workers", bounds.Workers())  # none started
    refused = refuse_threads(monkeypatch, daemons)
    client = own_pool_client(redis_url)
    own = counters.Tally()  # its writing thread starts with the count
    own.acquired(client, (STATS_KEY % "last-write").encode(), 60_000, "n", 0.0)
    own.close()
    assert counters_of(redis_client, "last-write") == {"acquired": 1}
    assert not refused  # no worker was even asked for
    client.close()


def test_the_last_write_to_a_hung_redis_gives_up_after_exit_wait(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.faultproxy import FaultProxy

    monkeypatch.setattr("django_redislock.holds.counters.EXIT_WAIT", 0.5)
    with FaultProxy(redis_url) as proxy:
        client = own_pool_client(proxy.url)
        client.ping()  # connected before the server stops answering
        own = counters.Tally()
        own.acquired(client, (STATS_KEY % "last-hung").encode(), 60_000, "n", 0.0)
        proxy.blackhole()
        started = time.monotonic()
        own.close()
        assert time.monotonic() - started < 0.5 + 2.0
        proxy.heal()
        client.close()


def test_a_hung_redis_holds_the_exit_of_a_process_on_its_own_pool_up_briefly(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """The last writes are given up after about WRITE_TIMEOUT (each writer's),
    not the socket timeout (none here), and a command abandoned on a worker
    thread does not hold the exit up either: before, Python's exit joined
    that worker, which waited for ever."""
    server = redis_server_factory()
    assert server.process is not None
    code = OWN_POOL_EXIT.format(timeout=None, freeze=server.process.pid)
    env = {**os.environ, **worker_env(), "REDISLOCK_TEST_REDIS_URL": server.url}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, timeout=60,
            capture_output=True, text=True,
        )  # fmt: skip
        exited = time.monotonic()
    finally:
        server.process.send_signal(signal.SIGCONT)
    last_words = float(done.stdout.split()[-1])
    # the one writer's last write, then the interpreter's teardown
    assert exited - last_words < 2 * counters.EXIT_WAIT + 3, exited - last_words


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_write_its_parents_counts(redis_client: redis.Redis) -> None:
    from tests.holds.test_fork import fork_and_run

    with Lock("forked-counts"):
        pass  # pending in this process, not yet written

    def child() -> int:
        counters.flush()
        return 0

    assert fork_and_run(child) == 0
    assert counters_of(redis_client, "forked-counts") == {"acquired": 1}


def test_pending_counts_are_readable_before_they_are_written(tally: counters.Tally) -> None:
    """What the 423 answer's Retry-After adds to the counters it reads."""
    client, other = object(), object()
    tally.acquired(client, b"k", 60_000, "n", 0.25)
    tally.acquired(client, b"k", 60_000, "n", 0.0)
    assert tally.pending(client, b"k") == (2, 250, 1)
    assert tally.pending(other, b"k") == (0, 0, 0)  # another server's counters
    assert tally.pending(client, b"j") == (0, 0, 0)


def test_counts_that_cannot_be_written_are_dropped_quietly() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there
    own = counters.Tally(background=False)
    own.acquired(dead, b"redislock:{x}:stats", 60_000, "n", 0.5)
    own.flush()  # no exception: statistics never break a lock
    assert own.pending(dead, b"redislock:{x}:stats") == (0, 0, 0)  # dropped, not kept to retry


def test_a_hung_redis_holds_a_write_up_for_the_write_timeout_only(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader (or the exit handler) flushing to a Redis that never answers
    gives up after WRITE_TIMEOUT, however long the client's own timeouts."""
    from tests.support.faultproxy import FaultProxy

    monkeypatch.setattr("django_redislock.holds.counters.WRITE_TIMEOUT", 0.5)
    with FaultProxy(redis_url) as proxy:
        hung = redis.Redis.from_url(proxy.url)  # no socket timeout of its own
        own = counters.Tally(background=False)
        own.acquired(hung, STATS_KEY.encode() % b"hung", 60_000, "n", 0.0)
        proxy.blackhole()
        started = time.monotonic()
        own.flush()
        assert time.monotonic() - started < 5
        proxy.heal()
        hung.close()
    assert not redis_client.exists(STATS_KEY % "hung")


def test_a_thread_that_cannot_start_never_fails_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts = refuse_threads(monkeypatch, counters)
    own = counters.Tally()
    client = object()
    own.acquired(client, b"k", 60_000, "n", 0.0)  # no exception reaches the acquire
    own.acquired(client, b"k", 60_000, "n", 0.0)
    assert len(starts) == 2  # each count tries again
    assert own.pending(client, b"k") == (2, 0, 0)  # and nothing was lost
    own.reset()  # the stand-in client cannot be written at exit


def test_a_thread_that_cannot_start_is_logged_once_until_one_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every count tries to start the thread: a process at its thread limit
    logged a WARNING with a traceback per acquire."""
    starts = refuse_threads(monkeypatch, counters)
    own = counters.Tally()
    client = object()
    with caplog.at_level(logging.DEBUG, logger="django_redislock.engine.threads"):
        for _ in range(5):
            own.acquired(client, b"k", 60_000, "n", 0.0)
    assert len(starts) == 5  # each count still tries again
    levels = [r.levelno for r in caplog.records if r.name == "django_redislock.engine.threads"]
    assert levels == [logging.WARNING] + [logging.DEBUG] * 4
    monkeypatch.undo()  # threads start again
    with own._lock:
        own._pending.clear()
        own._thread = own._life.start(own._run)
        assert own._thread is not None
        own._thread = None  # it ended (it sees it is no longer the writer and exits)
    refuse_threads(monkeypatch, counters)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="django_redislock.engine.threads"):
        own.acquired(client, b"k", 60_000, "n", 0.0)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # a new outage is told
    own.reset()


def test_a_flush_returns_after_the_write_already_in_flight(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``locks inspect`` and the dashboard flush, then read: when the writing
    thread had just taken the tally and was still writing it, the reader's
    flush found nothing, returned at once, and its own counts were missing."""
    from redis.client import Pipeline

    own = counters.Tally(background=False)
    execute, entered, go = Pipeline.execute, threading.Event(), threading.Event()

    def slow(self: Pipeline, *args: Any, **kwargs: Any) -> Any:
        if not entered.is_set():
            entered.set()
            go.wait(5)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", slow)
    own.acquired(redis_client, (STATS_KEY % "in-flight").encode(), 60_000, "n", 0.0)
    writer = threading.Thread(target=own.flush)  # as the writing thread's
    writer.start()
    assert entered.wait(5)
    threading.Timer(0.2, go.set).start()  # the in-flight write lands later
    own.flush()  # the reader's
    assert redis_client.hget(STATS_KEY % "in-flight", "acquired") == b"1"
    writer.join(5)


def test_inspect_shows_no_counters_once_counting_is_off() -> None:
    """Turned off, the hash left in Redis (kept up to an hour) is stale: the
    dashboard hides it, and so does ``locks inspect``."""
    with Lock("switched-off"):
        pass
    with override_settings(REDISLOCK={"STATS": False}), Lock("switched-off"):
        out = io.StringIO()
        call_command("locks", "inspect", "switched-off", stdout=out)
        data = io.StringIO()
        call_command("locks", "inspect", "switched-off", "--json", stdout=data)
    assert "counters: off (REDISLOCK['STATS'] is False)" in out.getvalue()
    assert json.loads(data.getvalue())["counters"] == {}


def test_inspect_and_json_show_counters() -> None:
    with Lock("report"):
        out = io.StringIO()
        call_command("locks", "inspect", "report", stdout=out)
        data = io.StringIO()
        call_command("locks", "inspect", "report", "--json", stdout=data)
    assert "counters: acquired=1, contended=0, waited=0, lost=0, wait_ms=0" in out.getvalue()
    assert json.loads(data.getvalue())["counters"] == {"acquired": 1}


@pytest.mark.django_db
def test_dashboard_shows_counters(admin_client: object) -> None:
    from django.test import Client

    assert isinstance(admin_client, Client)
    with Lock("sku:9"):
        row = admin_client.get("/admin/django_redislock/heldlock/data/").json()["results"][0]
        body = admin_client.get("/admin/django_redislock/heldlock/").content.decode()
    assert row["counters"] == {"acquired": 1}
    assert "<dt>acquired</dt><dd>1</dd><dt>contended</dt><dd>0</dd>" in body


@pytest.mark.parametrize("value", ["yes", 0, -5, float("nan"), 1e17])  # 1e17: PEXPIRE refused it
def test_setting_is_checked(value: object) -> None:
    with override_settings(REDISLOCK={"STATS": value}):
        errors = [e for e in run_checks() if e.id == "django_redislock.E012"]
    assert len(errors) == 1
    assert "REDISLOCK['STATS'] must be True, False or a positive number of seconds" in (
        errors[0].msg
    )


def test_stats_seconds_set_how_long_idle_counters_are_kept(redis_client: redis.Redis) -> None:
    with override_settings(REDISLOCK={"STATS": 5}), Lock("brief"):
        pass
    counters.flush()
    assert 0 < redis_client.pttl(STATS_KEY % "brief") <= 5000
