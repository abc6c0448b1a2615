from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from typing import Any
from unittest import mock

import pytest
import redis

from django_redislock import LockLostError, LockNotOwnedError, LockTimeout, Semaphore
from django_redislock import signals as lock_signals
from django_redislock.ops.inspection import clear, list_held
from tests.support.clients import LIB
from tests.support.gauge import Gauge
from tests.support.procs import CTX, processes, queued_in_turn, reap, start_one
from tests.support.signals_helper import capture

# --- workers (module level: spawned processes import them by name) ------------


def _skewed_clock(skew: float) -> Any:
    real = time.time
    return mock.patch("time.time", side_effect=lambda: real() + skew)


def _gauge_worker(
    name: str, limit: int, cycles: int, gauge: Gauge, skew: float, start: Any
) -> None:
    with _skewed_clock(skew):
        sem = Semaphore(name, limit, timeout=10, blocking_timeout=60)
        start.wait(60)  # all workers run at once, however slowly they were spawned
        for _ in range(cycles):
            with sem, gauge.inside() as inside:
                assert inside <= limit
                time.sleep(0.003)


def _ordered_waiter(name: str, index: int) -> None:
    sem = Semaphore(name, 1, timeout=10, blocking_timeout=60)
    with sem:
        redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"]).rpush("order", index)


def _hold_forever(name: str, lease: float, ready: Any) -> None:
    sem = Semaphore(name, 1, timeout=lease, auto_renew=True)
    assert sem.acquire(blocking=False)
    ready.set()
    time.sleep(600)


# --- basics ----------------------------------------------------------------------


def test_limit_holders_then_refuse_then_permit_returns(redis_client: redis.Redis) -> None:
    first, second, third = (Semaphore("api", 2) for _ in range(3))
    assert first.acquire()
    assert second.acquire()
    assert third.acquire(blocking=False) is False
    assert redis_client.zcard("redislock:{api}:semaphore") == 2
    first.release()
    assert third.acquire(blocking=False)
    second.release()
    third.release()
    assert not redis_client.exists("redislock:{api}:semaphore")
    # no fencing token was used, so none was taken: not even a counter is left
    assert redis_client.keys("redislock:{api}:*") == []
    with Semaphore("api", 2) as sem:
        assert sem.fencing_token
    assert redis_client.keys("redislock:{api}:*") == [b"redislock:{api}:sem:fence"]
    assert redis_client.pttl("redislock:{api}:sem:fence") > 0


def test_every_key_has_a_ttl_while_held_and_waited_for(redis_client: redis.Redis) -> None:
    holder = Semaphore("ttl", 1, timeout=5, fencing=True)  # the fence key too
    holder.acquire()
    waiter_done = threading.Event()

    def wait() -> None:
        Semaphore("ttl", 1, blocking_timeout=5).acquire()
        waiter_done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 5
    while not redis_client.zcard("redislock:{ttl}:sem:queue"):
        assert time.monotonic() < deadline, "waiter never queued"
        time.sleep(0.01)
    keys = redis_client.keys("redislock:{ttl}:*")
    assert len(keys) >= 4  # semaphore, fence, queue, deadlines, maybe a signal
    for key in keys:
        assert redis_client.pttl(key) > 0, key
    holder.release()
    assert waiter_done.wait(5)
    thread.join()


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3", True, None])
def test_bad_limit_is_a_value_error_naming_what_was_given(limit: object) -> None:
    with pytest.raises(ValueError, match=r"limit must be an int of at least 1, got"):
        Semaphore("x", limit)  # type: ignore[arg-type]


def test_limit_disagreeing_with_the_one_in_use(redis_client: redis.Redis) -> None:
    holder = Semaphore("pool", 3)
    holder.acquire()
    with pytest.raises(ValueError, match=r"in use with limit=3.*created with limit=5"):
        Semaphore("pool", 5).acquire()
    holder.release()
    assert Semaphore("pool", 5).acquire(blocking=False)  # idle name: no memory of 3


def test_the_limit_is_fixed_when_the_semaphore_is_built() -> None:
    """Resolutions are shared per (name, options): a limit changed later would
    be ignored, so assigning one is refused, and a new ``Semaphore`` is used."""
    sem = Semaphore("changed", 2)
    with sem:
        pass
    with pytest.raises(AttributeError, match=r"Semaphore.limit is fixed when"):
        sem.limit = 1  # type: ignore[misc]
    assert sem.limit == 2
    one = Semaphore("changed", 1)
    one.acquire()
    try:
        assert not Semaphore("changed", 1).acquire(blocking=False)  # full, not a mismatch
        with pytest.raises(ValueError, match=r"in use with limit=1"):
            sem.acquire(blocking=False)
    finally:
        one.release()
    for bad in (0, 2.0, True, "2"):
        with pytest.raises(ValueError, match=r"limit must be an int of at least 1, got"):
            Semaphore("changed", bad)  # type: ignore[arg-type]
    assert sem.holders() == []


def test_threads_with_ever_new_names_never_trip_over_the_call_cache() -> None:
    """Holder descriptions come from thread names, which threads may change at
    any time; building an acquire must never trip over that."""
    sem = Semaphore("renamed", 1000)
    errors: list[BaseException] = []
    names = itertools.count()
    switch_interval = sys.getswitchinterval()

    def work() -> None:
        for _ in range(3000):
            threading.current_thread().name = f"request-{next(names)}"
            try:
                steps = sem._acquire_steps(False, None)
                next(steps)  # builds the calls; sends nothing
                steps.close()
            except BaseException as exc:
                errors.append(exc)

    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch_interval)
    assert errors == []


def test_holders_lists_tokens_with_remaining_lease() -> None:
    sem = Semaphore("h", 3, timeout=20)
    sem.acquire()
    sem.acquire()  # a thread may hold two permits
    assert [h.fencing_token for h in sem.holders()] == [None, None]  # none taken yet
    token = sem.fencing_token  # the latest permit's, taken now
    holders = sem.holders()
    assert len(holders) == 2
    assert all(15 < h.ttl <= 20 for h in holders if h.ttl is not None)
    assert sorted(h.fencing_token or 0 for h in holders) == [0, token]
    assert holders[0].holder.endswith(threading.current_thread().name)
    sem.release()
    sem.release()
    assert sem.holders() == []


def test_fencing_tokens_increase_across_permits() -> None:
    sem = Semaphore("f", 2)
    tokens = []
    for _ in range(5):
        sem.acquire()
        tokens.append(sem.fencing_token)
        sem.release()
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 5


def test_release_without_permit_and_lost_lease(redis_client: redis.Redis) -> None:
    sem = Semaphore("lost", 1, timeout=5, auto_renew=False)
    with pytest.raises(LockNotOwnedError):
        sem.release()
    sem.acquire()
    assert sem.owned()
    redis_client.delete("redislock:{lost}:semaphore")
    assert not sem.owned()
    with pytest.raises(LockLostError):
        sem.release()
    with pytest.raises(LockNotOwnedError):
        sem.release()


def test_a_sole_holders_lease_is_the_keys_ttl(redis_client: redis.Redis) -> None:
    """The release of a sole holder reads no clock: the key's TTL is its lease,
    also once a holder with a longer lease left, and after a shorter renewal."""
    key = "redislock:{sole}:semaphore"
    long, short = Semaphore("sole", 2, timeout=60), Semaphore("sole", 2, timeout=2)
    long.acquire()
    short.acquire()
    assert redis_client.pttl(key) > 50_000
    long.release()
    assert 0 < redis_client.pttl(key) <= 2_000
    short.extend(30)
    assert redis_client.pttl(key) > 25_000
    short.extend(1)
    assert 0 < redis_client.pttl(key) <= 1_000
    short.release()
    assert not redis_client.exists(key)
    alone = Semaphore("sole", 2, timeout=2)  # taken on the fast path, renewed alone
    alone.acquire()
    alone.extend(30)
    assert redis_client.pttl(key) > 25_000
    alone.extend(1)
    assert 0 < redis_client.pttl(key) <= 1_000
    assert 0 < alone.holders()[0].ttl <= 1  # type: ignore[operator]
    alone.release()
    assert not redis_client.exists(key)


@pytest.mark.parametrize("brief_first", [False, True])
def test_a_lease_that_ended_beside_other_holders_is_reported_lost(
    redis_client: redis.Redis, brief_first: bool
) -> None:
    """Nobody pruned it (no acquire came), the key lives on for the other
    holder, and its release still finds the lease ended: LockLostError. (Taken
    first, the brief holder was alone, its lease the key's TTL, until the other
    joined.)"""
    other = Semaphore("beside", 2, timeout=30)
    brief = Semaphore("beside", 2, timeout=1.0, auto_renew=False)
    first, second = (brief, other) if brief_first else (other, brief)
    first.acquire()
    second.acquire()
    deadline = time.monotonic() + 5
    while len(other.holders()) > 1:  # the server's clock says when its lease ended
        assert time.monotonic() < deadline, "the lease never ended"
        time.sleep(0.02)
    assert redis_client.zcard("redislock:{beside}:semaphore") == 2  # still there, unpruned
    with pytest.raises(LockLostError):
        brief.release()
    assert other.owned()
    other.release()
    assert not redis_client.exists("redislock:{beside}:semaphore")


def test_a_lease_that_ended_alone_is_reported_lost(redis_client: redis.Redis) -> None:
    brief = Semaphore("alone", 3, timeout=0.2, auto_renew=False)
    brief.acquire()
    deadline = time.monotonic() + 5
    while redis_client.exists("redislock:{alone}:semaphore"):
        assert time.monotonic() < deadline, "the key outlived the lease"
        time.sleep(0.02)
    with pytest.raises(LockLostError):
        brief.release()


def test_extend_and_expired_lease_cannot_be_extended() -> None:
    sem = Semaphore("ext", 1, timeout=5, auto_renew=False)
    sem.acquire()
    sem.extend(20)
    assert sem.holders()[0].ttl is not None
    assert sem.holders()[0].ttl > 15  # type: ignore[operator]
    sem.extend(0.05)
    time.sleep(0.1)
    with pytest.raises(LockLostError):
        sem.extend()


def test_context_manager_times_out_with_retry_after() -> None:
    holder = Semaphore("cm", 1, timeout=20)
    holder.acquire()
    with pytest.raises(LockTimeout) as info, Semaphore("cm", 1, blocking_timeout=0.05):
        pass
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 20
    holder.release()


def test_watchdog_renews_permits_past_their_lease() -> None:
    sem = Semaphore("wd", 1, timeout=0.6, auto_renew=True)
    with sem:
        time.sleep(1.5)
        assert sem.owned()
        assert not Semaphore("wd", 1).acquire(blocking=False)


def test_operator_clear_is_reported_to_holder(redis_client: redis.Redis) -> None:
    sem = Semaphore("ops", 2, timeout=1.5, auto_renew=True)
    with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError):
        with sem:
            [info] = list_held(redis_client, "redislock", selected=["semaphore"])
            assert (info.name, info.kind, info.limit, len(info.holders)) == (
                "ops",
                "semaphore",
                2,
                1,
            )
            assert clear(redis_client, "redislock", "ops") == 1
            deadline = time.monotonic() + 5
            while not lost and time.monotonic() < deadline:
                time.sleep(0.02)
    assert lost and lost[0]["kind"] == "semaphore"


def test_waiter_woken_by_release_not_by_lease() -> None:
    holder = Semaphore("wake", 1, timeout=30)
    holder.acquire()
    waited: list[float] = []

    def wait() -> None:
        sem = Semaphore("wake", 1, blocking_timeout=20)
        start = time.monotonic()
        assert sem.acquire()
        waited.append(time.monotonic() - start)
        sem.release()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # let it queue; the assertion below does not depend on it
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert waited
    assert time.monotonic() - released < 1.5  # not the 30 s lease, not the 2 s chunk


def test_giving_up_leaves_no_queue(redis_client: redis.Redis) -> None:
    holder = Semaphore("gq", 1)
    holder.acquire()
    with capture(lock_signals.lock_contended) as contended:
        assert not Semaphore("gq", 1, blocking_timeout=0.05).acquire()
    assert contended[0]["kind"] == "semaphore"
    assert redis_client.zcard("redislock:{gq}:sem:queue") == 0
    holder.release()


def test_skewed_client_clock_cannot_steal_a_permit() -> None:
    holder = Semaphore("skew", 1, timeout=5)
    holder.acquire()
    for skew in (-600.0, 600.0, 3600.0):
        with _skewed_clock(skew):
            assert not Semaphore("skew", 1).acquire(blocking=False)
    holder.release()
    with _skewed_clock(-600.0):
        late = Semaphore("skew", 1, timeout=5)
        assert late.acquire(blocking=False)
        assert 4 < (late.holders()[0].ttl or 0) <= 5  # the lease is server time, not skewed
        late.release()


# --- real processes --------------------------------------------------------------


@pytest.mark.usefixtures("real_redis")
def test_gauge_never_exceeds_limit_and_reaches_it() -> None:
    gauge = Gauge()
    limit, workers, cycles = 3, 6, 40
    start = CTX.Barrier(workers)
    with processes(_gauge_worker, [("g", limit, cycles, gauge, 0.0, start)] * workers):
        pass
    assert gauge.entries == workers * cycles
    assert gauge.peak == limit


@pytest.mark.usefixtures("real_redis")
def test_skewed_clocks_over_grant_nothing() -> None:
    """Workers whose clocks are minutes apart share the permits exactly as without skew."""
    gauge = Gauge()
    skews = [-300.0, 0.0, 300.0, 900.0, -900.0]
    start = CTX.Barrier(len(skews))
    with processes(_gauge_worker, [("sk", 2, 30, gauge, skew, start) for skew in skews]):
        pass
    assert gauge.entries == len(skews) * 30
    assert gauge.peak == 2


@pytest.mark.usefixtures("real_redis")
def test_grant_order_is_arrival_order(redis_client: redis.Redis) -> None:
    holder = Semaphore("fifo", 1, timeout=30)
    holder.acquire()
    waiters = 5
    queue = "redislock:{fifo}:sem:queue"
    with queued_in_turn(
        redis_client, queue, _ordered_waiter, [("fifo", i) for i in range(waiters)]
    ):
        holder.release()
    assert [int(i) for i in redis_client.lrange("order", 0, -1)] == list(range(waiters))


@pytest.mark.usefixtures("real_redis")
def test_killed_holder_permit_returns_after_its_lease() -> None:
    ready = CTX.Event()
    lease = 2.0
    proc = start_one(_hold_forever, "dead", lease, ready)
    try:
        assert ready.wait(30)
        time.sleep(lease * 1.5)
        # the watchdog in the child kept the permit past its first lease
        assert not Semaphore("dead", 1).acquire(blocking=False)
        os.kill(proc.pid or 0, signal.SIGKILL)
        killed = time.monotonic()
        proc.join(10)
        assert Semaphore("dead", 1, blocking_timeout=15).acquire()
        waited = time.monotonic() - killed
        assert waited <= lease + 2.5, waited
    finally:
        reap([proc])


def test_unreachable_redis_raises_backend_error() -> None:
    from django.test import override_settings

    from django_redislock import LockBackendError
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    caches = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=caches), pytest.raises(LockBackendError) as info:
        Semaphore("down", 2).acquire()
    assert isinstance(info.value.__cause__, LIB.ConnectionError)


def test_dead_waiter_at_the_front_is_skipped(redis_client: redis.Redis) -> None:
    redis_client.zadd("redislock:{skip}:sem:queue", {"deadbeef": 1})
    redis_client.hset("redislock:{skip}:sem:deadlines", "deadbeef", 1)  # presumed dead long ago
    sem = Semaphore("skip", 1)
    assert sem.acquire(blocking=False)
    assert not redis_client.exists("redislock:{skip}:sem:queue")
    sem.release()


def test_live_waiter_at_the_front_is_not_overtaken(redis_client: redis.Redis) -> None:
    redis_client.zadd("redislock:{wait}:sem:queue", {"cafe": 1})
    redis_client.hset("redislock:{wait}:sem:deadlines", "cafe", 2**50)  # alive, on its way
    assert not Semaphore("wait", 1).acquire(blocking=False)
    assert redis_client.llen("redislock:{wait}:signal:cafe") == 1  # and it was woken
    assert Semaphore("wait", 2).acquire(blocking=False)  # a second permit is for the next


def _queued(sem: Semaphore) -> Any:
    """An acquire of ``sem`` driven by hand up to its first wait: the
    generator (its protocol steps) and the key of the list it waits on."""
    steps = sem._acquire_steps(True, 30)
    call = next(steps)
    wait = steps.send(call.script(sem._resolve().client, call.keys, call.args))
    return steps, wait.key


def _interrupted(sem: Semaphore, steps: Any) -> None:
    """``KeyboardInterrupt`` (or a task's cancellation) in the wait: the
    protocol's clean-up (the cancel script) runs, then the interrupt."""
    cleanup = steps.throw(KeyboardInterrupt())
    cleanup.script(sem._resolve().client, cleanup.keys, cleanup.args)
    with pytest.raises(KeyboardInterrupt):
        steps.send(None)


def test_a_woken_waiter_that_gives_up_passes_its_turn_on(redis_client: redis.Redis) -> None:
    """Two permits come free for three waiters: the first two are woken. If
    the second gives up (interrupted, its task cancelled) before it comes
    for its permit, the third is woken for it at once. Before, only a waiter
    at the head of the queue passed its wake-up on: the third slept through
    a free permit until its wait chunk ended (found by a review)."""
    holders = [Semaphore("turns", 2, timeout=60) for _ in range(2)]
    assert all(holder.acquire() for holder in holders)
    waiters = [Semaphore("turns", 2) for _ in range(3)]
    (first, first_key), (second, _), (third, third_key) = (_queued(w) for w in waiters)
    for holder in holders:
        holder.release()
    assert redis_client.llen(first_key) == 1 and redis_client.llen(third_key) == 0
    _interrupted(waiters[1], second)
    assert redis_client.llen(third_key) == 1
    for waiter, steps in ((waiters[0], first), (waiters[2], third)):
        _interrupted(waiter, steps)
    assert not redis_client.exists("redislock:{turns}:sem:queue")


def test_lock_and_semaphore_of_one_name_are_independent() -> None:
    from django_redislock import Lock

    with Lock("same"), Semaphore("same", 1) as sem:
        assert sem.owned()
        assert not Semaphore("same", 1).acquire(blocking=False)


def test_numbers_beyond_what_redis_and_floats_hold_are_value_errors() -> None:
    """An int too big for a float escaped as ``OverflowError``; a limit past
    2**53 reached Lua as a double (found by a review)."""
    from django_redislock import Lock, fenced_update

    huge = 10**400
    with pytest.raises(
        ValueError, match="timeout must be finite, got an int too large for a float"
    ):
        Lock("x", timeout=huge)
    with pytest.raises(ValueError, match="blocking_timeout must be finite"):
        Semaphore("x", 2, blocking_timeout=huge)
    with pytest.raises(ValueError, match="at most 2\\*\\*53"):
        Semaphore("x", 2**53 + 1)
    assert Semaphore("x", 2**53).limit == 2**53
    with pytest.raises(ValueError, match="below 2\\*\\*63"):
        fenced_update(object(), 2**63)  # type: ignore[arg-type]
