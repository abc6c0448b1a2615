"""Faults for real: partitions, restarts, pauses and a slow Redis.

Each test breaks something real (a TCP path through ``tests.support.faultproxy``, a
``redis-server`` process, a paused OS process) and checks the promise the docs
make about it (docs/faults.md). Holders whose behaviour is the claim run in
their own processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import (
    AsyncLock,
    Lock,
    LockBackendError,
    LockLostError,
    ReadWriteLock,
    Semaphore,
    fenced_update,
)
from django_redislock import signals as lock_signals
from django_redislock.holds import watchdog as watchdog_module
from tests.settings import redis_cache
from tests.support.clients import LIB, VALKEY
from tests.support.faultproxy import FaultProxy
from tests.support.other_holders import OtherThread
from tests.support.procs import CTX, processes
from tests.support.servers import RedisServer
from tests.support.signals_helper import capture

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("real_redis")]

#: What production sites commonly configure; the lease promises rely on one.
SOCKET_TIMEOUT = 0.3


def cache_through(url: str, **options: object) -> dict[str, object]:
    return redis_cache(
        url, SOCKET_TIMEOUT=SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT, **options
    )


def lock_key(name: str) -> str:
    return f"redislock:{{{name}}}:lock"


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "django-redislock-watchdog"]


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(redis_url) as running:
        yield running


@pytest.fixture
def quick_idle_watchdog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Let the watchdog thread exit soon after its last lease, and wait for it."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    with watchdog_module.watchdog._cond:  # an idle thread re-reads IDLE_EXIT at once
        watchdog_module.watchdog._cond.notify_all()
    _wait_no_watchdog()
    yield
    _wait_no_watchdog()


def _wait_no_watchdog(timeout: float = 10.0) -> None:
    for thread in watchdog_threads():
        thread.join(timeout)
    assert not watchdog_threads(), "the watchdog thread did not exit once idle"


# --- the proxy itself ------------------------------------------------------------------


def test_proxy_forwards_delays_blackholes_and_cuts(proxy: FaultProxy) -> None:
    client = redis.Redis.from_url(proxy.url, socket_timeout=0.5)
    try:
        assert client.ping()
        proxy.latency = 0.2
        started = time.monotonic()
        assert client.ping()
        assert time.monotonic() - started >= 0.35  # both directions delayed
        proxy.blackhole()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        proxy.heal()
        assert client.ping()
        assert proxy.open_connections() == 1
        proxy.cut()
        assert proxy.open_connections() == 0
        assert client.ping()  # redis-py reconnects through the proxy
        assert proxy.accepted >= 2
    finally:
        client.close()


def test_proxy_refuses_non_loopback_targets() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("redis://192.0.2.1:6380/0")


# --- partition ------------------------------------------------------------------------

LEASE = 2.0


def _partitioned_holder(proxy_url: str, events: Any, commands: Any) -> None:
    """Hold a lock through the proxy; report when and how it learns of the loss."""
    with override_settings(CACHES={"default": cache_through(proxy_url)}):
        lock = Lock("partitioned", timeout=LEASE, auto_renew=True)
        lost = threading.Event()
        seen: dict[str, float] = {}

        def on_lost(name: str, **kwargs: object) -> None:
            seen["at"] = time.monotonic()
            seen["deadline"] = holding.lease_deadline
            lost.set()

        lock_signals.lock_lost.connect(on_lost, weak=False)
        assert lock.acquire(blocking=False)
        holding = lock._holding()
        assert holding is not None
        events.put(("acquired", lock.fencing_token))
        if not lost.wait(LEASE * 5):
            events.put(("never told", None))
            return
        events.put(("lost", seen["at"], seen["deadline"]))
        assert commands.get(timeout=60) == "release"
        try:
            lock.release()
        except LockLostError:
            events.put(("released", "LockLostError"))
        else:
            events.put(("released", "released someone else's lock"))


def test_partitioned_holder_is_told_before_anyone_else_can_acquire(
    proxy: FaultProxy, redis_client: redis.Redis
) -> None:
    events, commands = CTX.Queue(), CTX.Queue()
    with processes(_partitioned_holder, [(proxy.url, events, commands)], timeout=60):
        kind, fence = events.get(timeout=60)
        assert kind == "acquired"
        proxy.blackhole()
        cut_at = time.monotonic()
        remaining = redis_client.pttl(lock_key("partitioned"))
        assert remaining > 0, "the holder's lease vanished as soon as it was cut off"
        lease_end = cut_at + remaining / 1000

        other = Lock("partitioned", timeout=30, blocking_timeout=LEASE * 5)
        assert other.acquire()
        acquired_at = time.monotonic()

        kind, lost_at, holder_deadline = events.get(timeout=30)
        assert kind == "lost"
        # told by its own watchdog no later than its own (conservative) lease end,
        assert lost_at <= holder_deadline
        # and so before Redis let anyone else in,
        assert lost_at <= acquired_at
        # and nobody got in before the lease, as Redis counted it, had run out.
        assert acquired_at >= lease_end - 0.05
        assert acquired_at - lease_end < 1.5  # the waiter noticed the expiry promptly
        assert other.fencing_token is not None and other.fencing_token > fence

        proxy.heal()
        commands.put("release")
        assert events.get(timeout=30) == ("released", "LockLostError")
        assert other.owned(), "the stale holder's release touched the new holder's lock"
        other.release()


# --- failover to a replica that missed the last grants -----------------------------------

FENCED_KINDS: dict[str, Callable[[str], Any]] = {
    "Lock": lambda name: Lock(name, timeout=30, auto_renew=False),
    "Semaphore": lambda name: Semaphore(name, 1, timeout=30, auto_renew=False),
    "ReadWriteLock": lambda name: ReadWriteLock(name, timeout=30, auto_renew=False).write(),
}


@pytest.mark.parametrize("kind", list(FENCED_KINDS))
def test_fencing_tokens_keep_increasing_across_a_failover_with_replication_lag(
    redis_server_factory: Callable[..., RedisServer], kind: str
) -> None:
    """A replica promoted with a stale fencing counter (it had the name's
    counter, but not the last grants) must still hand out larger tokens, so
    that the resource refuses the old holder's writes (docs/guarantees.md)."""
    primary, replica = redis_server_factory(), redis_server_factory()
    to_primary, to_replica = primary.client(), replica.client()
    to_replica.replicaof("127.0.0.1", primary.port)
    make = FENCED_KINDS[kind]
    try:
        with override_settings(CACHES={"default": cache_through(primary.url)}):
            with make("pay") as replicated:  # the counter exists on both
                assert replicated.fencing_token is not None
            deadline = time.monotonic() + 20
            while to_primary.wait(1, 500) < 1:  # the replica acknowledged all of it
                assert time.monotonic() < deadline, "the replica never caught up"
            to_replica.replicaof("NO", "ONE")  # what follows never reaches it: the lag
            old: list[int] = []
            for _ in range(5):
                with make("pay") as holder:
                    assert holder.fencing_token is not None
                    old.append(holder.fencing_token)
        primary.kill()
        # Sentinel waits down-after-milliseconds (seconds) before it promotes a
        # replica; the guarantee needs more than 10 ms (backend/scripts/_queue.lua)
        time.sleep(0.05)
        with override_settings(CACHES={"default": cache_through(replica.url)}):
            with make("pay") as promoted:
                assert promoted.fencing_token is not None
                assert promoted.fencing_token > max(old), (promoted.fencing_token, old)
    finally:
        to_primary.close()
        to_replica.close()


# --- restart without persistence --------------------------------------------------------


def test_redis_restart_loses_locks_and_fences_keep_increasing(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    caches = {"default": cache_through(server.url)}
    with override_settings(CACHES=caches), capture(lock_signals.lock_lost) as lost:
        before: list[int] = []
        for _ in range(5):  # advance the counters past their first value
            with Lock("r:a") as lock:
                assert lock.fencing_token is not None
                before.append(lock.fencing_token)
        holders = [Lock(f"r:{n}", timeout=1.5, auto_renew=True) for n in "abc"]
        for holder in holders:
            assert holder.acquire(blocking=False)
            assert holder.fencing_token is not None
            before.append(holder.fencing_token)

        outcome: list[str] = []

        def wait_for_c() -> None:
            waiter = Lock("r:c", timeout=30, auto_renew=False, blocking_timeout=15)
            try:
                if waiter.acquire():
                    outcome.append("acquired")
                    waiter.release()
                else:
                    outcome.append("timed out")
            except LockBackendError:
                outcome.append("LockBackendError")
            except BaseException as exc:
                outcome.append(repr(exc))

        waiting = threading.Thread(target=wait_for_c)
        waiting.start()
        probe = server.client()
        deadline = time.monotonic() + 10
        while not probe.zcard(lock_key("r:c").replace(":lock", ":queue")):
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        probe.close()

        server.restart()  # SIGKILL, then an empty server on the same port

        fresh = Lock("r:a", timeout=30, auto_renew=False)
        assert fresh.acquire(blocking=False), "acquire failed right after the restart"
        after = [fresh.fencing_token]
        for name in ("r:b", "r:new"):
            with Lock(name) as lock:
                after.append(lock.fencing_token)
        assert all(token is not None and token > max(before) for token in after)

        deadline = time.monotonic() + 10
        while len({call["name"] for call in lost}) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the watchdog reports on its own schedule
        assert {call["name"] for call in lost} >= {"r:a", "r:b", "r:c"}
        waiting.join(30)
        # a waiter caught by the restart gets the lock (its data is gone) or a clear error
        assert outcome in (["acquired"], ["LockBackendError"]), outcome
        for holder in holders:
            with pytest.raises(LockLostError):
                holder.release()
        assert fresh.owned(), "a stale holder released the lock taken after the restart"
        fresh.release()


# --- clock jumps -------------------------------------------------------------------------


@pytest.mark.parametrize("jump", [-3600.0, 3600.0])
def test_client_wall_clock_jumps_change_nothing(
    jump: float,
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    other_thread: OtherThread,
) -> None:
    """Leases, order and fences come from Redis's clock and the client's monotonic clock."""
    with Lock("clock") as lock:
        before = lock.fencing_token
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + jump)
    holder = Lock("clock", timeout=5, auto_renew=False)
    assert holder.acquire(blocking=False)
    assert before is not None and holder.fencing_token is not None
    assert holder.fencing_token > before
    remaining = redis_client.pttl(lock_key("clock"))
    assert 4000 < remaining <= 5000  # the lease is what was asked, whatever the wall clock
    assert not other_thread(Lock("clock").acquire, blocking=False)
    holder.release()
    after = Lock("clock", auto_renew=False)
    assert after.acquire(blocking=False)
    after.release()


# --- a paused holder -------------------------------------------------------------------


def _stale_writer(pk: int, events: Any, commands: Any) -> None:
    from tests.models import FencedRecord

    lock = Lock("record", timeout=1.0, auto_renew=True)
    with capture(lock_signals.lock_lost) as lost:
        assert lock.acquire(blocking=False)
        token = lock.fencing_token
        assert token is not None
        events.put(("acquired", token))
        assert commands.get(timeout=60) == "write"  # SIGSTOP and SIGCONT happen before this
        record = FencedRecord.objects.get(pk=pk)
        applied = fenced_update(record, token, value="stale")
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        events.put(("wrote", applied, bool(lost)))
    with contextlib.suppress(LockLostError):
        lock.release()


@pytest.mark.django_db(transaction=True)
def test_paused_holder_cannot_write_over_a_newer_token(redis_client: redis.Redis) -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create(value="initial")
    events, commands = CTX.Queue(), CTX.Queue()
    with processes(_stale_writer, [(record.pk, events, commands)], timeout=60) as procs:
        kind, stale_token = events.get(timeout=60)
        assert kind == "acquired"
        pid = procs[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            fresh = Lock("record", timeout=30, blocking_timeout=15)
            assert fresh.acquire(), "the paused holder's lease never ran out"
            fresh_fence = fresh.fencing_token
            assert fresh_fence is not None and fresh_fence > stale_token
            assert fenced_update(record, fresh_fence, value="fresh")
        finally:
            os.kill(pid, signal.SIGCONT)
        commands.put("write")
        kind, applied, told = events.get(timeout=30)
        assert kind == "wrote"
        assert applied is False, "the stale holder's write went through"
        assert told, "the resumed holder was never told it lost the lock"
        fresh.release()
    record.refresh_from_db()
    assert (record.value, record.fence) == ("fresh", fresh_fence)


# --- a slow Redis -----------------------------------------------------------------------


#: Threads any acquire may start that leave by themselves once idle: the
#: counters' writer, and the workers a bounded command waits on (one that must
#: set up a connection first, ``bounds.must_connect``).
_COME_AND_GO = ("django-redislock-counters", "django-redislock-bounded", "django-redislock-wakeups")


def _threads_but_counters() -> int:
    """Live threads, not counting those that leave by themselves once idle."""
    return sum(not t.name.startswith(_COME_AND_GO) for t in threading.enumerate())


def test_slow_redis_gives_backend_error_and_leaves_nothing_behind(
    proxy: FaultProxy, redis_client: redis.Redis, quick_idle_watchdog: None
) -> None:
    threads_before = _threads_but_counters()
    lease = 1.5
    with override_settings(CACHES={"default": cache_through(proxy.url)}):
        # 1. Slow from the start: the acquire fails clearly...
        proxy.latency = 1.0
        with pytest.raises(LockBackendError) as info:
            Lock("slow", timeout=lease).acquire()
        assert isinstance(info.value.__cause__, LIB.TimeoutError | LIB.ConnectionError)
        assert info.value.name == "slow"

        # 2. Slow while held: the watchdog cannot renew, the holder is told.
        proxy.heal()
        held = Lock("slow-held", timeout=lease, auto_renew=True)
        with capture(lock_signals.lock_lost) as lost:
            assert held.acquire(blocking=False)
            proxy.latency = 1.0
            deadline = time.monotonic() + lease * 4
            while not lost and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [call["name"] for call in lost] == ["slow-held"]
            with pytest.raises(LockLostError) as released:
                held.release()  # Redis is still slow: lost, and the slowness chained
            assert isinstance(released.value.__cause__, LockBackendError)
            assert len(lost) == 1
        proxy.heal()

    # ...and no lock is left held by nobody-knows-whom: whatever the slow
    # requests did, each key is gone or goes within its lease.
    for name in ("slow", "slow-held"):
        remaining = redis_client.pttl(lock_key(name))
        assert remaining == -2 or 0 < remaining <= lease * 1000
        assert Lock(name, timeout=5, blocking_timeout=lease + 3).acquire()
    # No renewal thread is left running for the failed holders.
    _wait_no_watchdog()
    assert _threads_but_counters() <= threads_before


def test_async_lock_through_a_slow_and_partitioned_redis(
    proxy: FaultProxy, redis_client: redis.Redis
) -> None:
    lease = 1.5

    async def main() -> tuple[list[str], float, float]:
        proxy.latency = 1.0
        with pytest.raises(LockBackendError) as info:
            await AsyncLock("aslow", timeout=lease).acquire()
        assert info.value.__cause__ is not None
        proxy.heal()
        held = AsyncLock("apart", timeout=lease, auto_renew=True)
        with capture(lock_signals.lock_lost) as lost:
            assert await held.acquire(blocking=False)
            holding = held._holding()
            assert holding is not None
            proxy.blackhole()
            deadline = time.monotonic() + lease * 4
            while not lost and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            told_at = time.monotonic()
        proxy.heal()
        with pytest.raises(LockLostError):
            await held.release()
        return [call["name"] for call in lost], told_at, holding.lease_deadline

    with override_settings(CACHES={"default": cache_through(proxy.url)}):
        names, told_at, lease_deadline = asyncio.run(main())
    assert names == ["apart"]
    assert told_at <= lease_deadline + 0.1  # polled every 50 ms
    for name in ("aslow", "apart"):
        assert Lock(name, timeout=5, blocking_timeout=lease + 3).acquire()


def test_cut_connections_are_reconnected_transparently(
    proxy: FaultProxy, redis_client: redis.Redis
) -> None:
    with override_settings(CACHES={"default": cache_through(proxy.url)}):
        lock = Lock("cut", timeout=5, auto_renew=False)
        assert lock.acquire(blocking=False)
        proxy.cut()
        try:
            lock.release()
        except LockBackendError:
            # redis-py may report the broken connection once; the lease then frees it
            pass
        else:
            assert not redis_client.exists(lock_key("cut"))
        assert Lock("cut", blocking_timeout=8).acquire()


# --- a lost reply, sent again by redis-py's retry policy ----------------------------------


def _retrying_cache(url: str) -> dict[str, object]:
    # the client library's own Retry (the other library's retries none of its errors);
    # valkey-py, as redis-py before 6, retries only the errors it is told to
    retry = LIB.retry.Retry(LIB.backoff.NoBackoff(), 2)
    kwargs: dict[str, object] = {"retry": retry}
    if VALKEY:
        kwargs["retry_on_error"] = [LIB.ConnectionError]
    return {"default": cache_through(url, CONNECTION_POOL_KWARGS=kwargs)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: __import__("django_redislock").Lock("retried", timeout=30),
        lambda: __import__("django_redislock").Semaphore("retried", 1, timeout=30),
        lambda: __import__("django_redislock").ReadWriteLock("retried", timeout=30).write(),
    ],
    ids=["Lock", "Semaphore", "ReadWriteLock"],
)
@pytest.mark.parametrize("blocking", [False, True], ids=["try", "wait"])
def test_an_acquire_sent_again_after_a_lost_reply_finds_itself_the_holder(
    proxy: FaultProxy, redis_client: redis.Redis, make: Callable[[], Any], blocking: bool
) -> None:
    """The first attempt ran and was granted, its reply was lost, redis-py sent
    it again: the second finds the grant its own (not a second permit, not a
    refusal that leaves the first grant held by nobody for a whole lease)."""
    with override_settings(CACHES=_retrying_cache(proxy.url)):
        primitive = make()
        # warm up with the same budget: scripts loaded, and a connection open in
        # the pool the acquire below uses (a budget's own bounded client), so the
        # reply dropped is the acquire's, not one of a new connection's set-up
        assert primitive.acquire(blocking=blocking, blocking_timeout=5)
        primitive.release()
        proxy.drop_replies(1)
        assert primitive.acquire(blocking=blocking, blocking_timeout=5)
        assert proxy.accepted >= 2  # the reply was lost, and the call sent again
        assert primitive.owned()
        keys = list(redis_client.scan_iter("redislock:{retried}:*"))
        main = next(k for k in keys if k.endswith((b":lock", b":semaphore", b":rwlock")))
        if redis_client.type(main) == b"zset":
            assert redis_client.zcard(main) == 1  # one permit, not two
        primitive.release()
        assert not redis_client.exists(main)
