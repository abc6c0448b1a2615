"""Every signal, with the arguments ``django_redislock.signals`` documents."""

from __future__ import annotations

import threading

import pytest
import redis

from django_redislock import Lock, LockLostError
from django_redislock import signals as lock_signals
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture


def test_acquired_and_released_carry_name_kind_and_timings() -> None:
    with (
        capture(lock_signals.lock_acquired) as acquired,
        capture(lock_signals.lock_released) as released,
    ):
        with Lock("sku:9", fencing=True) as lock:
            with lock:  # nesting sends nothing more
                token = lock.fencing_token
    assert len(acquired) == 1 and len(released) == 1
    assert acquired[0]["sender"] is Lock
    assert acquired[0]["name"] == "sku:9" and acquired[0]["kind"] == "lock"
    assert acquired[0]["fencing_token"] == token
    assert 0 <= acquired[0]["waited"] < 5
    assert released[0]["sender"] is Lock
    assert released[0]["name"] == "sku:9" and released[0]["kind"] == "lock"
    assert 0 <= released[0]["held"] < 5


def test_acquired_reports_the_wait() -> None:
    holder_has_it, go = threading.Event(), threading.Event()

    def hold() -> None:
        with Lock("waited"):
            holder_has_it.set()
            go.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holder_has_it.wait(10)
    timer = threading.Timer(0.3, go.set)
    timer.start()
    with capture(lock_signals.lock_acquired) as acquired:
        with Lock("waited", blocking_timeout=10):
            pass
    thread.join(10)
    timer.join(10)
    ours = [c for c in acquired if c["name"] == "waited"]
    assert ours[-1]["waited"] >= 0.2


def test_contended_when_a_waiter_gives_up(other_thread: OtherThread) -> None:
    holder = Lock("busy")
    other_thread(holder.acquire)
    with capture(lock_signals.lock_contended) as contended:
        assert not Lock("busy", blocking_timeout=0.1).acquire()
        assert not Lock("busy").acquire(blocking=False)
    other_thread(holder.release)
    assert [(c["name"], c["kind"]) for c in contended] == [("busy", "lock")] * 2
    assert contended[0]["waited"] >= 0.09
    assert contended[1]["waited"] < 1


def test_lost_on_release_carries_held_and_reason(redis_client: redis.Redis) -> None:
    with capture(lock_signals.lock_lost) as lost, capture(lock_signals.lock_released) as rel:
        with pytest.raises(LockLostError):
            with Lock("gone", auto_renew=False):
                redis_client.delete("redislock:{gone}:lock")
    assert rel == []  # a lost lock is not reported as released
    (call,) = lost
    assert call["sender"] is Lock and call["name"] == "gone" and call["kind"] == "lock"
    assert call["held"] >= 0
    assert "release" in call["reason"]


def test_lost_from_the_watchdog_is_sent_once(redis_client: redis.Redis) -> None:
    seen = threading.Event()

    def on_lost(**kwargs: object) -> None:
        seen.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with capture(lock_signals.lock_lost) as lost:
            with pytest.raises(LockLostError):
                with Lock("renewed", timeout=0.3):
                    redis_client.delete("redislock:{renewed}:lock")
                    assert seen.wait(5)
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
    assert len(lost) == 1
    assert "watchdog" in lost[0]["reason"]


@pytest.mark.parametrize("action", ["nested acquire", "extend"])
def test_lost_found_by_nested_acquire_or_extend(redis_client: redis.Redis, action: str) -> None:
    lock = Lock("found", auto_renew=False)
    with capture(lock_signals.lock_lost) as lost:
        with pytest.raises(LockLostError):
            with lock:
                redis_client.delete("redislock:{found}:lock")
                if action == "extend":
                    with pytest.raises(LockLostError, match="was lost"):
                        lock.extend()
                else:  # asks Redis, reports the old hold lost, and takes it afresh
                    assert lock.acquire(blocking=False)
                    assert lock.owned()
                    lock.release()
    assert len(lost) == 1  # told once, though the release finds it lost again
    word = "extended" if action == "extend" else "acquired it again"
    assert word in lost[0]["reason"]
    assert not lock.owned()
    assert lock.acquire(blocking=False)  # the holder can start afresh
    lock.release()
