"""A holder told while it holds: ``lost``, ``check()`` and ``on_lost``.

The lease is taken away the way it is in production: deleted by another
process (an operator's clear, a Redis flush), while the holder's watchdog
keeps renewing it; the holder must know within a renewal interval.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import Lock, LockLostError, MultiLock, ReadWriteLock, Semaphore
from django_redislock.holds import losses
from tests.support.loss_workers import hold_until_told
from tests.support.procs import CTX, reap, start_one


def delete_from_another_process(url: str, key: str) -> None:
    """``DEL key`` sent by a process of its own, as an operator's would be."""
    code = f"import redis; assert redis.Redis.from_url({url!r}).delete({key!r}) == 1"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class Told:
    """An ``on_lost`` callback that records each call and wakes the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, str, bool]] = []
        self.event = threading.Event()

    def __call__(self, hold: Any) -> None:
        self.calls.append((hold, threading.current_thread().name, hold.lost))
        self.event.set()


def test_a_lease_deleted_by_another_process_is_known_lost_at_once(redis_url: str) -> None:
    told = Told()
    lock = Lock("loss:deleted", timeout=0.6, on_lost=told)
    with pytest.raises(LockLostError, match="watchdog renewed it"):
        with lock:
            assert not lock.lost
            lock.check()  # held: nothing to say
            delete_from_another_process(redis_url, "redislock:{loss:deleted}:lock")
            # a renewal every 0.2 s: told well within a second, however loaded the box
            assert told.event.wait(10)
            assert lock.lost
            with pytest.raises(LockLostError, match="loss:deleted"):
                lock.check()
    # once, with the handle, on the loss-callback thread (never the watchdog's)
    assert [(hold, thread, lost) for hold, thread, lost in told.calls] == [
        (lock, "django-redislock-on-lost", True)
    ]
    assert not lock.lost  # left: it holds nothing now
    lock.check()


def test_the_holder_in_its_own_process_is_told(redis_client: redis.Redis) -> None:
    events, replies = CTX.Queue(), CTX.Queue()
    proc = start_one(hold_until_told, "loss:process", events, replies)
    try:
        assert events.get(timeout=60) == "held"
        assert redis_client.delete("redislock:{loss:process}:lock") == 1
        report = replies.get(timeout=60)
        proc.join(30)
    finally:
        reap([proc])
    assert report["told"] is True
    assert report["lost"] is True
    assert "was lost" in report["check"]
    assert report["calls"] == [("django-redislock-on-lost", True)]
    assert "was lost" in report["exit"]


def test_a_hold_that_is_not_lost_says_so_without_a_round_trip(
    redis_client: redis.Redis,
) -> None:
    told = Told()
    lock = Lock("loss:kept", timeout=5, on_lost=told)
    assert not lock.lost
    lock.check()  # holds nothing: nothing to say
    with lock:
        assert not lock.lost
        lock.check()
    assert not told.calls
    assert redis_client.exists("redislock:{loss:kept}:lock") == 0


def test_a_release_that_finds_the_lease_gone_calls_on_lost_once(
    redis_client: redis.Redis,
) -> None:
    told = Told()
    lock = Lock("loss:at-release", timeout=30, auto_renew=False, on_lost=told)
    with pytest.raises(LockLostError, match="when the holder released it"):
        with lock:
            redis_client.delete("redislock:{loss:at-release}:lock")
    assert told.event.wait(10)
    assert [call[0] for call in told.calls] == [lock]


def test_a_callback_that_raises_is_logged_and_the_next_one_runs(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(hold: Any) -> None:
        raise RuntimeError("the callback's own bug")

    told = Told()
    first = Lock("loss:broken", timeout=0.6, on_lost=broken)
    second = Lock("loss:after-broken", timeout=0.6, on_lost=told)
    with caplog.at_level(logging.ERROR, logger="django_redislock.holds.losses"):
        with pytest.raises(LockLostError), first:
            redis_client.delete("redislock:{loss:broken}:lock")
            deadline = time.monotonic() + 10
            while not first.lost:
                assert time.monotonic() < deadline, "the first hold was never found lost"
                time.sleep(0.01)  # polling a flag: the callback raises, nothing to wait on
            with pytest.raises(LockLostError), second:
                redis_client.delete("redislock:{loss:after-broken}:lock")
                assert told.event.wait(10)
    records = [r for r in caplog.records if "on_lost callback" in r.getMessage()]
    assert len(records) == 1
    assert "loss:broken" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert "the callback's own bug" in str(records[0].exc_info[1])


def test_a_slow_callback_never_delays_other_holds_renewals(redis_client: redis.Redis) -> None:
    """The callback blocks its thread for several leases of another hold,
    which the watchdog keeps renewing meanwhile."""
    release = threading.Event()
    started = threading.Event()

    def stuck(hold: Any) -> None:
        started.set()
        release.wait(30)

    doomed = Lock("loss:slow-callback", timeout=0.6, on_lost=stuck)
    other = Lock("loss:still-renewed", timeout=1.0)
    try:
        with other:
            with pytest.raises(LockLostError), doomed:
                redis_client.delete("redislock:{loss:slow-callback}:lock")
                assert started.wait(10)
            # the callback still blocks: three leases of the other hold go by
            renewed_until = time.monotonic() + 3.0
            while time.monotonic() < renewed_until:
                assert redis_client.exists("redislock:{loss:still-renewed}:lock")
                time.sleep(0.05)  # sampling the key over a span of time is the point
            assert not other.lost
            assert started.is_set() and not release.is_set()
    finally:
        release.set()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"on_lost": 3}, TypeError, "on_lost must be a callable"),
        ({"max_hold": 0}, ValueError, "max_hold must be positive"),
        ({"max_hold": -1}, ValueError, "max_hold must be positive"),
        ({"max_hold": float("nan")}, ValueError, "max_hold must be finite"),
        ({"max_hold": float("inf")}, ValueError, "max_hold must be finite"),
        ({"max_hold": "60"}, TypeError, "max_hold must be a number of seconds"),
        ({"max_hold": True}, TypeError, "max_hold must be a number of seconds"),
    ],
)
def test_bad_loss_options_are_refused_at_construction(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Lock("loss:bad", **options)
    with pytest.raises(error, match=match):
        Semaphore("loss:bad", 2, **options)


def test_cancel_on_loss_is_for_asyncio_holds_only() -> None:
    with pytest.raises(TypeError, match="cancel_on_loss is for asyncio holds"):
        Semaphore("loss:bad", 2, cancel_on_loss=True)
    with pytest.raises(TypeError):
        Lock("loss:bad", cancel_on_loss=True)  # type: ignore[call-arg]


def test_the_options_read_back() -> None:
    def on_lost(hold: Any) -> None: ...

    lock = Lock("loss:options", on_lost=on_lost, max_hold=60)
    assert lock.on_lost is on_lost
    assert lock.max_hold == 60.0
    assert not lock.cancel_on_loss
    plain = Lock("loss:options")
    assert plain.on_lost is None and plain.max_hold is None and not plain.cancel_on_loss
    assert losses.thread_count() in (0, 1)


#: Each sync permit primitive, built with the options given, and its holders' key.
PERMITS = {
    "Semaphore": (lambda name, **o: Semaphore(name, 2, **o), "semaphore"),
    "ReadWriteLock.read": (lambda name, **o: ReadWriteLock(name, **o).read(), "rwlock"),
    "ReadWriteLock.write": (lambda name, **o: ReadWriteLock(name, **o).write(), "rwlock"),
}


@pytest.mark.parametrize("kind", list(PERMITS))
def test_a_permit_deleted_by_another_process_is_known_lost_at_once(
    redis_url: str, kind: str
) -> None:
    build, part = PERMITS[kind]
    name = f"loss:permit:{kind}"
    told = Told()
    hold = build(name, timeout=0.6, on_lost=told)
    with pytest.raises(LockLostError), hold:
        assert not hold.lost
        hold.check()
        delete_from_another_process(redis_url, f"redislock:{{{name}}}:{part}")
        assert told.event.wait(10)
        assert hold.lost
        with pytest.raises(LockLostError, match="watchdog renewed it"):
            hold.check()
    assert [(h, thread, lost) for h, thread, lost in told.calls] == [
        (hold, "django-redislock-on-lost", True)
    ]
    assert not hold.lost


def test_a_multilock_is_told_once_whichever_parts_are_lost(redis_url: str) -> None:
    told = Told()
    multi = MultiLock(["loss:cart:a", "loss:cart:b"], timeout=0.6, on_lost=told)
    with pytest.raises(LockLostError), multi:
        assert not multi.lost
        multi.check()
        delete_from_another_process(redis_url, "redislock:{loss:cart:b}:lock")
        assert told.event.wait(10)
        assert multi.lost
        with pytest.raises(LockLostError, match="loss:cart:b"):
            multi.check()
        # a second part lost later: still one call for the set
        delete_from_another_process(redis_url, "redislock:{loss:cart:a}:lock")
        deadline = time.monotonic() + 10
        while not multi.locks[0].lost:
            assert time.monotonic() < deadline, "the second part was never found lost"
            time.sleep(0.01)  # polling a flag: no callback is expected to wake us
    assert [(hold, thread, lost) for hold, thread, lost in told.calls] == [
        (multi, "django-redislock-on-lost", True)
    ]
