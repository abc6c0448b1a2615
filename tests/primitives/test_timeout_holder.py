"""``LockTimeout.holder`` and ``held_for``: who held the name when the wait
ended, read from the refusing script's reply (no extra round trip), for every
primitive; the holder is another OS process where it can be."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_redislock import (
    AsyncLock,
    Lock,
    LockTimeout,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
)
from django_redislock import signals as lock_signals
from django_redislock.backend import client as backend
from django_redislock.context import describe_holder
from tests.support.other_holders import OtherThread
from tests.support.procs import CTX, reap, start_one
from tests.support.scaleout import RedlockServers
from tests.support.signals_helper import capture

WHAT = "nightly import"


def _make(kind: str, name: str) -> Any:
    if kind == "lock":
        return Lock(name, timeout=30)
    if kind == "semaphore":
        return Semaphore(name, 1, timeout=30)
    side = ReadWriteLock(name, timeout=30)
    return side.write() if kind == "write" else side.read()


def _hold(kind: str, name: str, ready: Any, release: Any) -> None:
    """Hold ``name`` (as ``kind``) until told to let go."""
    with describe_holder(WHAT):
        primitive = _make(kind, name)
        assert primitive.acquire(blocking_timeout=30)
    ready.set()
    release.wait(60)
    primitive.release()


@pytest.fixture
def held_elsewhere() -> Iterator[Callable[[str, str], tuple[int, float]]]:
    """Hold a name in another process: ``(pid, time.time() before it began)``."""
    started: list[Any] = []
    release = CTX.Event()

    def hold(kind: str, name: str) -> tuple[int, float]:
        ready = CTX.Event()
        before = time.time()
        proc = start_one(_hold, kind, name, ready, release)
        started.append(proc)
        assert ready.wait(60), "the holder never took the name"
        return proc.pid or 0, before

    yield hold
    release.set()
    for proc in started:
        proc.join(30)
    reap(started)
    # The processes hold the Events in reference cycles: collected now, their
    # semaphores are unregistered here, not by a later collection that may run
    # inside the resource tracker's own call (ReentrantCallError on 3.12.1).
    started.clear()
    gc.collect()


def assert_names(error: LockTimeout, pid: int, before: float, waited: float) -> None:
    holder = error.holder
    assert holder is not None
    assert holder.pid == pid
    assert holder.runs == WHAT
    assert len(holder.token) == 8  # shortened as operators see it: too short to act with
    assert error.held_for is not None
    assert waited - 0.1 <= error.held_for <= time.time() - before + 1.0
    assert f"pid {pid} ({WHAT})" in str(error)
    assert "held by" in str(error)


@pytest.mark.parametrize(
    ("kind", "ours"),
    [
        ("lock", lambda name: Lock(name, blocking_timeout=0.3)),
        ("semaphore", lambda name: Semaphore(name, 1, blocking_timeout=0.3)),
        ("write", lambda name: ReadWriteLock(name, blocking_timeout=0.3).read()),
        ("read", lambda name: ReadWriteLock(name, blocking_timeout=0.3).write()),
    ],
)
def test_a_timed_out_acquire_names_the_holder_in_another_process(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
    kind: str,
    ours: Callable[[str], Any],
) -> None:
    pid, before = held_elsewhere(kind, f"who:{kind}")
    with pytest.raises(LockTimeout) as info, ours(f"who:{kind}"):
        pass
    assert_names(info.value, pid, before, 0.3)
    if kind in ("write", "read"):
        assert info.value.holder is not None
        assert info.value.holder.mode == kind


def test_waiting_and_refused_at_once_both_name_the_holder(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
) -> None:
    pid, before = held_elsewhere("lock", "who:modes")
    for blocking, blocking_timeout, waited in ((True, 0.4, 0.4), (False, None, 0.0)):
        lock = Lock("who:modes", blocking=blocking, blocking_timeout=blocking_timeout)
        with pytest.raises(LockTimeout) as info, lock:
            pass
        assert_names(info.value, pid, before, waited)
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 30


def test_an_async_lock_names_the_holder(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
) -> None:
    pid, before = held_elsewhere("lock", "who:async")

    async def contend() -> LockTimeout:
        with pytest.raises(LockTimeout) as info:
            async with AsyncLock("who:async", blocking_timeout=0.3):
                pass
        return info.value

    assert_names(asyncio.run(contend()), pid, before, 0.3)


def test_a_multilock_names_the_part_and_its_holder(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
) -> None:
    pid, before = held_elsewhere("lock", "who:b")
    with pytest.raises(LockTimeout) as info, MultiLock(["who:a", "who:b"], blocking_timeout=0.3):
        pass
    assert info.value.name == "who:b"
    assert_names(info.value, pid, before, 0.0)
    assert not Lock("who:a").locked()  # all or nothing, as before


def test_the_exception_pickles_with_its_holder(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
) -> None:
    pid, _ = held_elsewhere("lock", "who:pickled")
    with pytest.raises(LockTimeout) as info, Lock("who:pickled", blocking=False):
        pass
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.holder, copy.held_for) == (info.value.holder, info.value.held_for)
    assert (copy.name, copy.retry_after, str(copy)) == ("who:pickled", info.value.retry_after,
                                                        str(info.value))  # fmt: skip
    assert copy.holder is not None and copy.holder.pid == pid


def test_a_refusal_that_names_nobody_leaves_holder_none(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    """A value not written by this app (set by hand) names no holder, and is
    no error: the timeout stands."""
    key = backend.key(backend.namespace("default", "redislock"), "who:foreign", "lock")
    redis_client.set(key, "not a lock value", px=30_000)
    with pytest.raises(LockTimeout) as info, Lock("who:foreign", blocking_timeout=0.2):
        pass
    assert (info.value.holder, info.value.held_for) == (None, None)
    assert str(info.value) == "Could not acquire lock 'who:foreign' in time."


def test_a_holder_that_releases_as_the_wait_ends_is_named_or_none_never_an_error() -> None:
    """The holder is read by the refusal itself, atomically: whatever the race
    with a holder that takes and releases the name over and over, the waiter
    gets the lock, or a timeout naming the holder of that moment (or nobody,
    the name being promised to a waiter ahead); never another error."""
    stop = threading.Event()

    def churn() -> None:
        lock = Lock("who:race", timeout=30)
        while not stop.is_set():
            with lock:
                time.sleep(0.002)

    thread = threading.Thread(target=churn, name="churner")
    thread.start()
    outcomes: list[object] = []
    try:
        for _ in range(50):
            try:
                with Lock("who:race", blocking=False):
                    outcomes.append("held")
            except LockTimeout as exc:
                outcomes.append(exc.holder)
    finally:
        stop.set()
        thread.join(30)
    timed_out = [o for o in outcomes if o != "held"]
    assert all(o is None or (o.pid, o.thread) == (os.getpid(), "churner") for o in timed_out)


def test_lock_contended_carries_holder_and_held_for(
    held_elsewhere: Callable[[str, str], tuple[int, float]],
) -> None:
    pid, _ = held_elsewhere("semaphore", "who:signal")
    with capture(lock_signals.lock_contended) as calls:
        assert not Semaphore("who:signal", 1).acquire(blocking_timeout=0.2)
    [call] = calls
    assert call["holder"] is not None and call["holder"].pid == pid
    assert call["held_for"] is not None and call["held_for"] >= 0.2 - 0.1
    assert call["outcome"] == "timeout"


@pytest.mark.scaleout
def test_a_redlock_names_the_holder_most_servers_name(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    held = Redlock("who:quorum")

    def take() -> bool:
        with describe_holder(WHAT):
            return held.acquire()

    assert other_thread(take)
    try:
        with pytest.raises(LockTimeout) as info, Redlock("who:quorum", blocking_timeout=0.2):
            pass
        holder = info.value.holder
        assert holder is not None
        assert (holder.pid, holder.runs) == (os.getpid(), WHAT)
        assert holder.thread.startswith("other-holder")
    finally:
        other_thread(held.release)
