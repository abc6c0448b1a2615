"""A child made by ``fork()`` neither owns, renews nor releases its parent's lock."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import warnings

import pytest
import redis

from django_redislock import Lock, LockNotOwnedError
from django_redislock.engine import bounds
from django_redislock.engine import janitor as janitor_module
from django_redislock.holds import counters
from django_redislock.holds.watchdog import watchdog
from django_redislock.ops import history as hot

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def fork_and_run(child: object, in_parent: object = None, *, hooks: bool = True) -> int:
    """Run ``child()`` in a forked process; its return value is the exit status.

    ``in_parent()``, if given, runs in the parent right after the fork.
    ``hooks=False`` forks with C's ``fork()``, as uWSGI does without
    ``py-call-osafterfork``: no ``os.register_at_fork`` hook runs.
    """
    if not hooks:
        _threads_settled()
    with warnings.catch_warnings():
        # 3.12+ warns that forking a multi-threaded process (the watchdog) may deadlock;
        # the child here touches nothing the watchdog holds.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork() if hooks else ctypes.CDLL(None, use_errno=True).fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            assert callable(child)
            status = int(child())
        except BaseException as exc:
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            os._exit(status)
    if callable(in_parent):
        in_parent()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _threads_settled() -> None:
    """Until no thread of the parent is starting: a thread whose ``start()``
    has returned still takes ``threading``'s own lock once more, to move
    itself from ``_limbo`` to ``_active``. C's ``fork()`` then gives the child
    that lock held, and no hook resets it, so the child's first thread start
    waits for ever (a run met it: the watchdog's thread, started by the
    parent's ``Lock`` just before). Python's ``os.fork`` resets it; a real
    hook-less fork (uWSGI's master) forks before it serves, with its threads
    long started. CPython's private names: this is CPython's own hazard."""
    deadline = time.monotonic() + 10
    limbo = threading._limbo  # type: ignore[attr-defined]
    lock = threading._active_limbo_lock  # type: ignore[attr-defined]
    while True:
        with lock:  # taken and let go here: no thread holds it as we leave
            if not limbo:
                return
        assert time.monotonic() < deadline, "a thread of the parent never finished starting"
        time.sleep(0.001)


def test_forked_child_does_not_own_renew_or_release(redis_client: redis.Redis) -> None:
    lock = Lock("forked", timeout=0.6)
    assert lock.acquire()
    parent_token = lock.fencing_token

    def child() -> int:
        failures = 0
        if lock.owned() or lock.fencing_token is not None:
            failures |= 2
        if watchdog.watching() != 0 or watchdog._thread is not None:
            failures |= 4
        try:
            lock.release()
        except LockNotOwnedError:
            pass
        else:
            failures |= 8
        if lock.acquire(blocking=False):  # the parent still holds it
            failures |= 16
        if not lock.locked():
            failures |= 32
        return failures

    assert fork_and_run(child) == 0
    # the parent keeps the lock, renewed by its own watchdog past several leases
    time.sleep(1.5)
    assert lock.owned()
    assert lock.fencing_token == parent_token
    lock.release()
    assert not redis_client.exists("redislock:{forked}:lock")


def test_child_can_take_its_own_locks_after_fork() -> None:
    lock = Lock("child-own", timeout=5)

    def child() -> int:
        with lock:
            ok = lock.owned() and watchdog.watching() == 1
        return 0 if ok and not lock.locked() else 1

    assert fork_and_run(child) == 0


def test_child_does_not_renew_the_parents_lease(redis_client: redis.Redis) -> None:
    lock = Lock("orphan", timeout=0.5)  # auto-renewed in the parent
    lock.acquire()
    holding = lock._holding()
    assert holding is not None

    def child() -> int:
        time.sleep(1.5)  # three leases: a renewing child would keep the key alive
        return 0

    def parent_stops_renewing() -> None:
        watchdog.unwatch(holding)  # as if the parent had stopped

    assert fork_and_run(child, parent_stops_renewing) == 0
    assert not redis_client.exists("redislock:{orphan}:lock")


def test_janitor_starts_empty_with_a_free_lock_in_the_child() -> None:
    """A fork while the janitor thread holds its lock must not leave the
    child's janitor locked for ever."""
    janitor = janitor_module.janitor
    with janitor._lock:  # as if the janitor thread held it at fork()

        def child() -> int:
            if not janitor._lock.acquire(timeout=2):
                return 2
            janitor._lock.release()
            return 0 if janitor.pending() == 0 and janitor._thread is None else 4

        assert fork_and_run(child) == 0


def test_bounded_workers_start_afresh_in_the_child() -> None:
    workers = bounds.workers
    assert workers.call(5, int, "1") == 1  # the parent has a worker
    with workers._mutex:  # as if another thread held it at fork()

        def child() -> int:
            if workers.workers() != 0:  # the parent's worker is not here
                return 2
            return 0 if workers.call(5, int, "2") == 2 else 4

        assert fork_and_run(child) == 0


# forked without the hooks (uWSGI without py-call-osafterfork) --------------------


def test_a_child_forked_without_the_hooks_renews_its_own_leases() -> None:
    """The parent's watchdog thread is not in the child: the child's
    watchdog must see that for itself and start its own."""
    with Lock("hookless:parent", timeout=5):  # the parent's thread, idle for 5 s
        pass
    assert watchdog._thread is not None

    def child() -> int:
        lock = Lock("hookless:child", timeout=0.6)
        lock.acquire()
        time.sleep(2.0)  # over three leases: only renewals keep it
        if not lock.owned():
            return 2
        lock.release()
        return 0

    assert fork_and_run(child, hooks=False) == 0


def test_a_child_forked_without_the_hooks_never_writes_its_parents_counts(
    redis_client: redis.Redis,
) -> None:
    tally = counters.Tally(background=False, history=lambda: (redis_client, "redislock"))
    tally.acquired(redis_client, b"redislock:{hookless}:stats", 60_000, "hookless", 0.0)

    def child() -> int:
        tally.flush()
        tally.close()  # as at the child's exit
        return 0

    assert fork_and_run(child, hooks=False) == 0
    tally.flush()
    assert redis_client.hget("redislock:{hookless}:stats", "acquired") == b"1"
    minutes = [m for m in hot.read(redis_client, "redislock", time.time(), 2) if m]
    assert [m["hookless"]["acquired"] for m in minutes] == [1]


def test_cluster_clients_start_afresh_in_the_child() -> None:
    """A fork while another thread builds a ``RedisCluster`` client (holding
    the table's lock) must not leave the child's table locked for ever, nor
    hand it the parent's client."""
    from django_redislock import cluster

    clusters = cluster._clusters
    clusters._clients["parent's"] = object()  # type: ignore[assignment]
    try:
        with clusters._lock:

            def child() -> int:
                if not clusters._lock.acquire(timeout=2):
                    return 2
                clusters._lock.release()
                return 0 if not clusters._clients else 3

            assert fork_and_run(child) == 0
    finally:
        clusters._clients.pop("parent's", None)


def test_a_forked_child_of_a_leader_leads_nothing_and_its_resign_releases_nothing() -> None:
    from django_redislock import Leadership

    leader = Leadership("forked-leader", timeout=0.6)
    assert leader.campaign()

    def child() -> int:
        failures = 0
        if leader.is_leader or leader.fencing_token is not None:
            failures |= 2
        leader.resign()  # the parent's term: nothing to send
        return failures

    assert fork_and_run(child) == 0
    assert leader.is_leader
    info = Leadership.leader_of("forked-leader")
    assert info is not None and info.fencing_token == leader.fencing_token
    leader.resign()
