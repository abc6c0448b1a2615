"""Proof, with real OS processes and the real redis-server, that ``Lock`` survives
each failure mode of the seed articles, and that a naive lock does not.

Each naive/ours pair runs the same scenario; the naive lock lives in
``tests/support/naive.py`` and the worker code in ``tests/support/proof_workers.py``. Processes
are synchronised through Redis mailboxes (``BLPOP``), never by sleeping; the
only sleeps are the "work" a holder does and the lease a test waits out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import redis

from django_redislock import Lock
from tests.support import proof_workers as w
from tests.support.naive import NaiveLock
from tests.support.procs import CTX, _entry, processes, worker_env

pytestmark = [pytest.mark.usefixtures("real_redis"), pytest.mark.slow]

LOCK_KEY = "redislock:{{{}}}:lock"


@pytest.fixture
def conn(redis_url: str) -> Iterator[redis.Redis]:
    client = w.client(redis_url)
    yield client
    client.close()


@contextmanager
def process(target: Callable[..., Any], *args: Any) -> Iterator[BaseProcess]:
    """One worker process that the test may SIGKILL; killed on exit if still alive."""
    from django.db import connections

    connections.close_all()
    proc = CTX.Process(target=_entry, args=(worker_env(), target, args))
    proc.start()
    try:
        yield proc
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


def sigkill(proc: BaseProcess) -> None:
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -9


def wait_until(
    check: Callable[[], bool], timeout: float = 30, what: str | Callable[[], str] = ""
) -> None:
    """Poll Redis state that has no event of its own (e.g. "is queued")."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.02)


def start_together(conn: redis.Redis, count: int, value: object = "1") -> None:
    for _ in range(count):
        w.take(conn, "ready", timeout=120)
    for _ in range(count):
        w.post(conn, "go", value)


def gauge_samples(conn: redis.Redis) -> list[int]:
    return [int(v) for v in conn.lrange(w.SAMPLES, 0, -1)]


# (a) SETNX then EXPIRE: a crash between the two ------------------------------------------


def test_a_naive_setnx_then_expire_crash_leaves_lock_held_for_ever(conn: redis.Redis) -> None:
    with process(w.naive_setnx_then_crash, "a", 0.5) as victim:
        w.take(conn, "between")
        sigkill(victim)
    assert conn.pttl("naive:a") == -1  # exists, with no lease at all
    # Four times the intended lease later, nobody can get it, and nobody ever will.
    assert not NaiveLock(conn, "a", lease=0.5).acquire(timeout=2.0)
    assert conn.pttl("naive:a") == -1


def test_a_ours_lock_has_its_lease_from_the_first_instant(conn: redis.Redis) -> None:
    lease = 1.0
    with process(w.ours_acquire_then_hang, "a", lease) as victim:
        w.take(conn, "holds")
        sigkill(victim)
    remaining = conn.pttl(LOCK_KEY.format("a"))
    assert 0 < remaining <= lease * 1000
    started = time.monotonic()
    assert Lock("a", blocking_timeout=30).acquire()
    assert time.monotonic() - started < lease + 5


def test_a_ours_killed_at_any_point_of_a_hot_loop_never_leaves_a_lock_without_lease(
    conn: redis.Redis,
) -> None:
    with process(w.ours_hot_loop, "hot", 5.0) as victim:
        w.take(conn, "looping")
        time.sleep(0.2)  # let it run: the kill lands at an arbitrary point of the loop
        sigkill(victim)
    key = LOCK_KEY.format("hot")
    assert conn.pttl(key) != -1  # absent (-2) or with a lease, never lease-less
    assert Lock("hot", blocking_timeout=30).acquire()


# (b) a slow holder releasing a lock that is no longer its own ---------------------------


def run_slow_holder_scenario(conn: redis.Redis, ours: bool) -> dict[str, str]:
    lease = 0.5
    with (
        process(w.third_comer, "b", ours),
        process(w.slow_holder, "b", lease, ours),
    ):
        w.take(conn, "A-holds")
        with process(w.second_holder, "b", ours):
            w.take(conn, "B-holds")  # only after A's lease ran out
            w.post(conn, "A-go")  # A wakes up and releases
            results = {"A": w.take(conn, "A-result")}
            w.post(conn, "C-go")  # a third process comes along while B holds
            results["C"] = w.take(conn, "C-result")
            w.post(conn, "B-go")
            results["B"] = w.take(conn, "B-result")
    return results


def test_b_naive_unconditional_delete_lets_a_third_holder_in(conn: redis.Redis) -> None:
    results = run_slow_holder_scenario(conn, ours=False)
    assert results["A"] == "released"  # A deleted B's lock without noticing
    assert results["C"] == "got"  # B and C both hold the lock
    assert results["B"] == "not-owned"


def test_b_ours_slow_holder_is_told_and_the_second_holder_keeps_the_lock(
    conn: redis.Redis,
) -> None:
    results = run_slow_holder_scenario(conn, ours=True)
    assert results == {"A": "lost", "C": "refused", "B": "owned"}


# (c) a task longer than the lease -----------------------------------------------------


@pytest.mark.parametrize("ours", [False, True], ids=["naive", "ours"])
def test_c_task_longer_than_the_lease(conn: redis.Redis, ours: bool) -> None:
    lease, work, workers = 0.8, 2.5, 3  # each task outlives three leases
    with processes(w.long_task, [("c", lease, work, ours)] * workers):
        start_together(conn, workers)
    samples = gauge_samples(conn)
    assert len(samples) == workers
    if ours:
        assert max(samples) == 1, f"holders overlapped: {samples}"
    else:
        assert max(samples) > 1, f"the naive lock did not overlap: {samples}"


# (d) a holder (or a waiter) killed with SIGKILL --------------------------------------------


def test_d_killed_holder_frees_the_lock_after_its_lease_and_nobody_waits_for_ever(
    conn: redis.Redis,
) -> None:
    lease, waiters = 1.0, 3
    with process(w.ours_acquire_then_hang, "d", lease) as holder:
        w.take(conn, "holds")
        with processes(w.waiter, [("d",)] * waiters, timeout=60):
            for _ in range(waiters):
                w.take(conn, "waiting")
            wait_until(
                lambda: conn.zcard("redislock:{d}:queue") == waiters,
                what=lambda: (
                    f"queued: {conn.zrange('redislock:{d}:queue', 0, -1)} "
                    f"lock: {conn.get('redislock:{d}:lock')}"
                ),
            )
            killed_at = time.time()
            sigkill(holder)
    times = sorted(float(t) - killed_at for t in conn.lrange("proof:acquired-at", 0, -1))
    assert len(times) == waiters
    assert times[0] < lease + 3, f"first waiter got the lock {times[0]:.2f}s after the kill"
    assert times[-1] < lease + 5, f"waiters got the lock at {times}"
    assert max(gauge_samples(conn)) == 1


def test_d_killed_waiter_does_not_block_the_queue(conn: redis.Redis) -> None:
    holder = Lock("dq", timeout=30)
    assert holder.acquire()
    with process(w.waiter, "dq") as dead:
        w.take(conn, "waiting")
        wait_until(lambda: conn.zcard("redislock:{dq}:queue") == 1, what="first waiter queued")
        with processes(w.waiter, [("dq",)], timeout=60):
            w.take(conn, "waiting")
            wait_until(lambda: conn.zcard("redislock:{dq}:queue") == 2, what="second queued")
            sigkill(dead)  # the head of the queue dies while waiting
            released_at = time.time()
            holder.release()
    (acquired,) = (float(t) for t in conn.lrange("proof:acquired-at", 0, -1))
    # at most one wait chunk (2 s) plus the dead waiter's grace (1 s), with margin
    assert acquired - released_at < 8


# (e) read-sleep-write on a shared counter by 8 processes ----------------------------------


@pytest.mark.parametrize("mode", ["none", "ours"])
def test_e_eight_processes_read_sleep_write(conn: redis.Redis, mode: str) -> None:
    workers, rounds = 8, 5
    with processes(w.read_sleep_write, [(rounds, mode)] * workers):
        start_together(conn, workers)
    final = int(conn.get(w.COUNTER) or 0)
    if mode == "ours":
        assert final == workers * rounds
        samples = gauge_samples(conn)
        assert len(samples) == workers * rounds
        assert max(samples) == 1, f"more than one holder at once: {max(samples)}"
    else:
        assert final < workers * rounds, "no update was lost without a lock"


# fairness under greedy competition ---------------------------------------------------------


def test_greedy_processes_each_get_at_least_half_their_fair_share(conn: redis.Redis) -> None:
    workers, window = 4, 3.0
    with processes(w.greedy, [("fair", i) for i in range(workers)], timeout=120):
        for _ in range(workers):
            w.take(conn, "ready", timeout=120)
        stop = time.time() + window
        for _ in range(workers):
            w.post(conn, "go", repr(stop))
    counts = [int(conn.hget("proof:counts", str(i)) or 0) for i in range(workers)]
    total = sum(counts)
    assert total >= workers * 10, f"too few acquisitions to judge: {counts}"
    assert min(counts) >= total / workers / 2, f"unfair shares: {counts}"
    assert max(gauge_samples(conn)) == 1
