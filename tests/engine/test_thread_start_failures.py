"""Background threads that fail to start once (the process's thread, pid or
memory limit reached for a moment) must start on a later call, and a child
forked without Python's fork hooks must start its own (found by a review)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock.engine import janitor as janitor_module
from django_redislock.engine.steps import Call
from django_redislock.primitives.redlock import fanout
from tests.holds.test_fork import fork_and_run


def _refuse(self: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


def _until(condition: Any, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_janitor_starts_again_after_its_thread_failed_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[int] = []
    janitor = janitor_module.Janitor()
    monkeypatch.setattr(threading.Thread, "start", _refuse)
    janitor.submit(redis.Redis(port=1), Call(lambda c, k, a: sent.append(1), [], []))
    monkeypatch.undo()
    janitor.submit(redis.Redis(port=1), Call(lambda c, k, a: sent.append(2), [], []))
    assert _until(lambda: sent == [1, 2]), f"clean-ups never delivered: {sent}"
    assert janitor.wait_idle(5)


def test_the_janitor_delivers_in_a_child_forked_without_the_hooks(redis_url: str) -> None:
    gate: concurrent.futures.Future[None] = concurrent.futures.Future()
    janitor_module.janitor.submit(
        redis.Redis(port=1), Call(lambda c, k, a: None, [], []), after=gate
    )
    assert _until(
        lambda: janitor_module.janitor.pending() == 1 and janitor_module.janitor._thread is not None
    )
    time.sleep(0.2)  # the thread settled in its wait: a C fork while it holds the GIL hangs
    try:

        def child() -> int:
            client = redis.Redis.from_url(redis_url)
            janitor_module.janitor.submit(
                client, Call(lambda c, k, a: c.set("janitor:child", 1), [], [])
            )
            return 0 if _until(lambda: client.exists("janitor:child"), 3) else 2

        assert fork_and_run(child, hooks=False) == 0
    finally:
        gate.set_result(None)
        assert janitor_module.janitor.wait_idle(5)


def test_a_redlock_servers_pool_survives_failed_thread_starts(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    servers = fanout.Servers([redis_client])

    def ping(client: Any, keys: Any, args: Any) -> Any:
        return client.ping()

    monkeypatch.setattr(threading.Thread, "start", _refuse)
    for _ in range(fanout.WORKERS_PER_SERVER):
        [reply] = servers.run(ping, [], [], timeout=0.2)  # type: ignore[arg-type]
        assert isinstance(reply, redis.RedisError)  # a per-server error, not a RuntimeError
    monkeypatch.undo()
    [reply] = servers.run(ping, [], [], timeout=2)  # type: ignore[arg-type]
    assert reply is True
