"""The daemon worker pool behind ``bounds.Workers`` (see ``engine/workers.py``)."""

from __future__ import annotations

import threading

import pytest

from django_redislock.engine import workers as daemons
from django_redislock.engine.workers import DaemonPool
from tests.support.threads import refuse_threads


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_workers_are_daemons_that_exit_when_idle() -> None:
    """A daemon is not joined at exit: one waiting on a hung Redis would
    otherwise hold the process up for ever."""
    pool = DaemonPool(4, "test-daemons-idle", idle_exit=0.2)
    busy = threading.Event()
    running = pool.submit(busy.wait, 30)
    workers = threads_named("test-daemons-idle")  # it cannot idle out while busy
    busy.set()
    assert running.result(timeout=5) is True
    assert workers and all(t.daemon for t in workers)
    for worker in workers:
        worker.join(10)
        assert not worker.is_alive(), "an idle worker never exited"
    assert pool.workers() == 0
    assert pool.submit(pow, 3, 2).result(timeout=5) == 9  # a new one starts on demand


def test_a_stuck_call_does_not_hold_up_the_next() -> None:
    pool = DaemonPool(4, "test-daemons-stuck", idle_exit=0.5)
    stuck = threading.Event()
    try:
        first = pool.submit(stuck.wait, 30)
        assert pool.submit(divmod, 7, 2).result(timeout=5) == (3, 1)
        with pytest.raises(ZeroDivisionError):  # the call's own error reaches the caller
            pool.submit(divmod, 1, 0).result(timeout=5)
        assert not first.done()
    finally:
        stuck.set()
    assert first.result(timeout=5) is True


def test_at_most_max_workers_and_the_rest_queue() -> None:
    pool = DaemonPool(2, "test-daemons-max", idle_exit=0.5)
    gate = threading.Event()
    try:
        held = [pool.submit(gate.wait, 30) for _ in range(2)]
        queued = pool.submit(int, "5")
        assert pool.workers() == 2
        assert not queued.done()  # both workers are busy
    finally:
        gate.set()
    assert queued.result(timeout=5) == 5
    assert all(f.result(timeout=5) for f in held)


def test_a_refused_thread_fails_the_call_only_when_no_worker_would_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As at exit on Python 3.12+, or at the process's thread limit."""
    pool = DaemonPool(4, "test-daemons-refused", idle_exit=0.5)
    gate = threading.Event()
    try:
        busy = pool.submit(gate.wait, 30)  # one worker, started before the refusals
        refused = refuse_threads(monkeypatch, daemons)
        later = pool.submit(int, "7")  # queued for the running worker
        assert len(refused) == 1
    finally:
        gate.set()
    assert busy.result(timeout=5) is True and later.result(timeout=5) == 7
    for worker in threads_named("test-daemons-refused"):
        worker.join(10)  # idle, it exits
    assert pool.workers() == 0
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(int, "8")
    assert not pool._jobs  # not left queued for nobody


def test_a_pool_whose_every_worker_is_past_its_deadline_refuses_at_once() -> None:
    """A hung server (Redlock's fan-out): every worker held by a job whose
    caller gave up. A job queued behind them would be too late anyway."""
    import time

    pool = DaemonPool(2, "test-daemons-hung", idle_exit=0.5)
    gate = threading.Event()
    started = [threading.Event() for _ in range(3)]
    try:
        soon = time.monotonic() + 0.2
        stuck = [
            pool.submit(lambda e: e.set() or gate.wait(30), s, deadline=soon) for s in started[:2]
        ]
        assert all(s.wait(5) for s in started[:2])
        time.sleep(0.3)  # the subject is the deadline passing
        with pytest.raises(daemons.Hung):
            pool.submit(int, "1", deadline=time.monotonic() + 5)
        assert not pool._jobs  # not queued
    finally:
        gate.set()
    assert all(f.result(timeout=5) for f in stuck)
    # a worker free again: jobs are taken
    assert pool.submit(int, "2", deadline=time.monotonic() + 5).result(timeout=5) == 2


def test_a_pool_with_a_worker_within_its_deadline_queues() -> None:
    import time

    pool = DaemonPool(1, "test-daemons-busy", idle_exit=0.5)
    gate = threading.Event()
    try:
        held = pool.submit(gate.wait, 30, deadline=time.monotonic() + 30)
        queued = pool.submit(int, "3", deadline=time.monotonic() + 30)
        assert not queued.done()
    finally:
        gate.set()
    assert held.result(timeout=5) is True and queued.result(timeout=5) == 3
