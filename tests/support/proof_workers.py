"""Code that runs in the worker processes of ``tests/faults/test_naive_lock_failures.py``.

Processes talk to the test through *mailboxes*: Redis lists that one side
``post``s to and the other ``take``s from with ``BLPOP``. That is an event, not
a sleep, and it works across processes on the test's private server. Wall-clock
times (``time.time()``) are comparable between processes on one machine.
"""

from __future__ import annotations

import os
import time

import redis
from django.test import override_settings

from django_redislock import Lock, LockLostError
from tests.support.naive import NaiveLock

GAUGE = "proof:gauge"  # holders inside the critical section right now
SAMPLES = "proof:samples"  # the gauge as each holder saw it on entry
COUNTER = "proof:counter"


def client(url: str | None = None) -> redis.Redis:
    """A plain client for mailboxes and gauges. No socket timeout: redis-py 8's
    default of 5 s would cut a long ``BLPOP`` on a mailbox short."""
    return redis.Redis.from_url(
        url or os.environ["REDISLOCK_TEST_REDIS_URL"], decode_responses=True, socket_timeout=None
    )


def post(conn: redis.Redis, box: str, value: object = "1") -> None:
    conn.rpush(f"proof:box:{box}", str(value))


def take(conn: redis.Redis, box: str, timeout: float = 60) -> str:
    got = conn.blpop([f"proof:box:{box}"], timeout=timeout)
    if got is None:
        raise AssertionError(f"nothing arrived in mailbox {box!r} within {timeout}s")
    return str(got[1])


def hang(conn: redis.Redis) -> None:
    """Block until the test kills this process (the box is never posted to)."""
    take(conn, "never", timeout=600)


def barrier(conn: redis.Redis) -> str:
    """Say ready, then wait for the test's go (whose value may carry data)."""
    post(conn, "ready")
    return take(conn, "go")


def enter(conn: redis.Redis) -> None:
    conn.rpush(SAMPLES, conn.incr(GAUGE))


def leave(conn: redis.Redis) -> None:
    conn.decr(GAUGE)


# (a) the crash window of SETNX then EXPIRE ----------------------------------------


def naive_setnx_then_crash(name: str, lease: float) -> None:
    conn = client()

    def crash_window() -> None:
        post(conn, "between")
        hang(conn)

    NaiveLock(conn, name, lease=lease, atomic=False).try_acquire(between=crash_window)


def ours_acquire_then_hang(name: str, lease: float) -> None:
    conn = client()
    lock = Lock(name, timeout=lease)  # kept referenced: the watchdog renews it until the kill
    assert lock.acquire(blocking=False)
    post(conn, "holds")
    hang(conn)
    lock.release()  # never reached


def ours_hot_loop(name: str, lease: float) -> None:
    conn = client()
    lock = Lock(name, timeout=lease, auto_renew=False)
    first = True
    while True:
        with lock:
            if first:
                post(conn, "looping")
                first = False


# (b) a slow holder releasing after its lease ran out --------------------------------


def slow_holder(name: str, lease: float, ours: bool) -> None:
    conn = client()
    lock: Lock | NaiveLock
    if ours:
        lock = Lock(name, timeout=lease, auto_renew=False)
        assert lock.acquire(blocking=False)
    else:
        lock = NaiveLock(conn, name, lease=lease)
        assert lock.try_acquire()
    post(conn, "A-holds")
    take(conn, "A-go")  # "slow": resumes only after its lease ran out and B got in
    try:
        lock.release()
    except LockLostError:
        post(conn, "A-result", "lost")
    else:
        post(conn, "A-result", "released")


def second_holder(name: str, ours: bool) -> None:
    conn = client()
    if ours:
        lock = Lock(name, blocking_timeout=60)
        assert lock.acquire()
        post(conn, "B-holds")
        take(conn, "B-go")
        post(conn, "B-result", "owned" if lock.owned() else "not-owned")
        if lock.owned():
            lock.release()
        return
    naive = NaiveLock(conn, name, lease=30)
    assert naive.acquire(timeout=60)
    post(conn, "B-holds")
    take(conn, "B-go")
    post(conn, "B-result", "owned" if conn.get(naive.key) == naive.token else "not-owned")


def third_comer(name: str, ours: bool) -> None:
    conn = client()
    take(conn, "C-go")
    if ours:
        got = Lock(name, timeout=30).acquire(blocking=False)
    else:
        got = NaiveLock(conn, name, lease=30).try_acquire()
    post(conn, "C-result", "got" if got else "refused")


# (c) a task longer than the lease, and (e) read-sleep-write ----------------------------


def long_task(name: str, lease: float, work: float, ours: bool) -> None:
    conn = client()
    barrier(conn)
    lock: Lock | NaiveLock
    if ours:
        lock = Lock(name, timeout=lease, blocking_timeout=120)
        assert lock.acquire()
    else:
        lock = NaiveLock(conn, name, lease=lease, safe_release=True)
        assert lock.acquire(timeout=120)
    enter(conn)
    time.sleep(work)  # the task itself, not synchronisation
    leave(conn)
    lock.release()  # ours raises LockLostError if exclusion was lost


def read_sleep_write(rounds: int, mode: str) -> None:
    conn = client()
    barrier(conn)
    for _ in range(rounds):
        if mode == "ours":
            with Lock("counter", timeout=10, blocking_timeout=120):
                enter(conn)
                value = int(conn.get(COUNTER) or 0)
                time.sleep(0.005)
                conn.set(COUNTER, value + 1)
                leave(conn)
        else:
            value = int(conn.get(COUNTER) or 0)
            time.sleep(0.005)
            conn.set(COUNTER, value + 1)


# (d) SIGKILL of a holder or a waiter, and greedy fairness --------------------------------


def waiter(name: str) -> None:
    """Wait with no time limit at all and report when the lock came.

    If a dead holder or waiter could block the lock for ever, this hangs and the
    test's process timeout fails it.
    """
    conn = client()
    lock = Lock(name, timeout=10)
    post(conn, "waiting")
    with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": None}):
        assert lock.acquire()
    conn.rpush("proof:acquired-at", repr(time.time()))
    enter(conn)
    leave(conn)
    lock.release()


def greedy(name: str, index: int) -> None:
    """Acquire, release and compete again at once until the test's stop time."""
    conn = client()
    stop = float(barrier(conn))
    lock = Lock(name, timeout=10, blocking_timeout=60)
    count = 0
    while time.time() < stop:
        with lock:
            enter(conn)
            leave(conn)
            count += 1
    conn.hset("proof:counts", str(index), count)
