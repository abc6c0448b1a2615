"""A busy connection pool is a wait, never an outage (``engine/pool.py``).

redis-py's default pool refuses a command at once when all of its
``max_connections`` are in use (``MaxConnectionsError``). That was once
reported as "Redis is unreachable" and answered 503 while Redis idled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from django_redislock import (
    AsyncLock,
    Lock,
    LockBackendError,
    LockPoolExhausted,
    LockTimeout,
    require_lock,
)
from django_redislock.backend import client as backend
from django_redislock.engine import pool
from tests.settings import redis_cache


@pytest.fixture
def small_pool(redis_url: str) -> Iterator[Any]:
    """The default cache, its pool capped at 3 connections (a URL of its own:
    django-redis keeps one pool per URL)."""
    caches = {
        "default": redis_cache(
            f"{redis_url}?client_name=small", CONNECTION_POOL_KWARGS={"max_connections": 3}
        )
    }
    with override_settings(CACHES=caches):
        yield backend.get_client("default")


class Occupied:
    """Every connection of ``client``'s pool taken, as by the site's own calls."""

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.taken = [self._take() for _ in range(self.pool.max_connections)]

    def _take(self) -> Any:
        # redis-py before 5.3 needs the command's name; later ones warn when given it
        params = inspect.signature(self.pool.get_connection).parameters
        if params["command_name"].default is inspect.Parameter.empty:
            return self.pool.get_connection("PING")
        return self.pool.get_connection()

    def give_one_back(self) -> None:
        self.pool.release(self.taken.pop())

    def give_back(self) -> None:
        while self.taken:
            self.give_one_back()


def test_a_pool_full_for_the_whole_budget_is_a_timeout_not_an_outage(
    small_pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    warm = Lock("full")
    assert warm.acquire()  # a connection made and pooled
    warm.release()
    occupied = Occupied(small_pool)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, "django_redislock.engine.pool"):
            with pytest.raises(LockTimeout) as raised:
                with Lock("full", blocking_timeout=1):
                    pass
        took = time.monotonic() - started
    finally:
        occupied.give_back()
    assert not isinstance(raised.value, LockBackendError)
    assert 0.9 <= took < 5.0
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "max_connections=3" in logged and "Redis itself was not asked" in logged


def test_a_connection_given_back_lets_a_waiting_acquire_through(small_pool: Any) -> None:
    occupied = Occupied(small_pool)
    outcome: list[bool] = []
    thread = threading.Thread(
        target=lambda: outcome.append(Lock("given-back", blocking_timeout=20).acquire())
    )
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while not pool.gates.waiting:  # it waits for a connection, not for Redis
            assert time.monotonic() < deadline, "the acquire never waited for the pool"
            time.sleep(0.01)
        occupied.give_one_back()
        thread.join(20)
    finally:
        occupied.give_back()
    assert outcome == [True]


def test_a_release_that_never_finds_a_connection_names_the_pool(
    small_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "PATIENCE", 0.3)
    lock = Lock("release-full", timeout=2)  # a short lease: the test waits it out below
    assert lock.acquire()
    occupied = Occupied(small_pool)
    try:
        with pytest.raises(LockPoolExhausted) as raised:
            lock.release()
    finally:
        occupied.give_back()
    message = str(raised.value)
    assert "connection pool is exhausted" in message and "all 3 connections" in message
    assert "max_connections" in message and "unreachable" not in message
    assert raised.value.max_connections == 3
    assert Lock("release-full").acquire(blocking_timeout=20)  # its lease freed it, unrenewed


def test_many_threads_through_a_tiny_pool_meet_no_backend_error(small_pool: Any) -> None:
    errors: list[BaseException] = []
    inside = [0]
    overlaps = [0]

    def worker() -> None:
        for _ in range(5):
            try:
                with Lock("tiny", blocking_timeout=60):
                    inside[0] += 1
                    overlaps[0] += inside[0] > 1
                    time.sleep(0.001)
                    inside[0] -= 1
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and overlaps == [0]
    assert small_pool.connection_pool._created_connections <= 3


def test_many_tasks_through_a_tiny_asyncio_pool_meet_no_backend_error(small_pool: Any) -> None:
    async def main() -> list[Any]:
        async def one() -> None:
            async with AsyncLock("tiny-async", blocking_timeout=60):
                await asyncio.sleep(0.001)

        return await asyncio.gather(*(one() for _ in range(200)), return_exceptions=True)

    assert asyncio.run(main()) == [None] * 200


def test_a_view_answers_a_pool_exhaustion_with_its_own_503(rf: RequestFactory) -> None:
    """Not the outage's wording: Redis was never asked."""

    @require_lock("view-pool")
    def view(request: HttpRequest) -> HttpResponse:
        raise backend.exhausted_error(
            "inner", backend.PoolExhausted("no free connection (max_connections=3)", 3)
        )

    response = view(rf.post("/"))
    assert response.status_code == 503
    assert b"connection pool is full" in response.content
    assert response["Redislock-Error"] == "lock_pool_exhausted"
