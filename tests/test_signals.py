"""Every signal, with the arguments ``django_redislock.signals`` documents."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from django_redislock import (
    AsyncLock,
    AsyncSemaphore,
    Lock,
    LockBackendError,
    LockLostError,
    Semaphore,
)
from django_redislock import signals as lock_signals
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread
from tests.support.servers import free_port
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
    assert [c["outcome"] for c in contended] == ["timeout", "refused"]


def test_contended_says_timeout_or_refused_for_a_semaphore(other_thread: OtherThread) -> None:
    holder = Semaphore("busy-sem", 1)
    other_thread(holder.acquire)
    with capture(lock_signals.lock_contended) as contended:
        assert not Semaphore("busy-sem", 1, blocking_timeout=0.1).acquire()
        assert not Semaphore("busy-sem", 1).acquire(blocking=False)
    other_thread(holder.release)
    assert [(c["kind"], c["outcome"]) for c in contended] == [
        ("semaphore", "timeout"),
        ("semaphore", "refused"),
    ]


@pytest.mark.parametrize("primitive", [Lock, lambda name, **kw: Semaphore(name, 2, **kw)])
def test_failed_when_redis_cannot_be_reached(settings: Any, primitive: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "down": redis_cache(f"redis://127.0.0.1:{free_port()}/0"),
    }
    with (
        capture(lock_signals.lock_failed) as failed,
        capture(lock_signals.lock_contended) as contended,
    ):
        with pytest.raises(LockBackendError) as raised:
            primitive("sku:down", using="down").acquire(blocking=False)
    assert contended == []
    (call,) = failed
    assert call["name"] == "sku:down" and call["error"] is raised.value
    assert 0 <= call["waited"] < 10


def test_failed_for_async_primitives(settings: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "down": redis_cache(f"redis://127.0.0.1:{free_port()}/0"),
    }

    async def try_both() -> None:
        for primitive in (
            AsyncLock("a:down", using="down"),
            AsyncSemaphore("s:down", 2, using="down"),
        ):
            with pytest.raises(LockBackendError):
                await primitive.acquire(blocking=False)

    with capture(lock_signals.lock_failed) as failed:
        asyncio.run(try_both())
    assert [(c["name"], c["kind"]) for c in failed] == [("a:down", "lock"), ("s:down", "semaphore")]


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
