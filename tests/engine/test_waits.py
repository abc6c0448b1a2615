"""Waiting: arrival order, and nothing left behind when a wait is interrupted."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import redis

from django_redislock import Lock

QUEUE = "redislock:{{{}}}:queue"


def wait_for_queue(client: redis.Redis, name: str, size: int) -> None:
    deadline = time.monotonic() + 10
    while client.zcard(QUEUE.format(name)) != size:
        assert time.monotonic() < deadline, f"queue of {name!r} never reached {size}"
        time.sleep(0.01)


def test_waiters_are_served_in_arrival_order(redis_client: redis.Redis) -> None:
    holder = Lock("fifo")
    holder.acquire()
    order: list[int] = []

    def wait(index: int) -> None:
        with Lock("fifo", blocking_timeout=30):
            order.append(index)

    threads = []
    for index in range(4):
        thread = threading.Thread(target=wait, args=(index,))
        thread.start()
        threads.append(thread)
        wait_for_queue(redis_client, "fifo", index + 1)  # arrival order is known
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3]


def test_releaser_competing_again_queues_behind_the_waiter(redis_client: redis.Redis) -> None:
    holder = Lock("behind")
    holder.acquire()
    got: list[str] = []

    def wait() -> None:
        with Lock("behind", blocking_timeout=30):
            got.append("waiter")

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_queue(redis_client, "behind", 1)
    holder.release()
    assert holder.acquire(blocking_timeout=30)  # greedy: straight back in line
    got.append("releaser")
    holder.release()
    thread.join(30)
    assert got == ["waiter", "releaser"]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_interrupted_wait_leaves_no_queue_entry(redis_client: redis.Redis) -> None:
    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    holder_has_it, done = threading.Event(), threading.Event()

    def hold() -> None:
        with Lock("interrupted"):
            holder_has_it.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holder_has_it.wait(10)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)  # e.g. a request timeout mid-wait
        with pytest.raises(Interrupted):
            Lock("interrupted", blocking_timeout=20).acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        done.set()
        thread.join(10)
    assert redis_client.zcard(QUEUE.format("interrupted")) == 0
    assert Lock("interrupted").acquire(blocking=False)
