"""How an acquire's commands are bounded by its budget (``engine/bounds.py``); the
behaviour on a paused server is in ``tests/engine/test_hung_server.py``."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock.engine import bounds
from django_redislock.engine import janitor as janitor_module
from django_redislock.engine.steps import Call
from tests.support.servers import free_port


@pytest.mark.parametrize(
    "remaining", [-1.0, 0.0, 0.1, 0.5, 0.6, 1.0, 1.9, 2.0, 2.1, 5.0, 9.99, 3600]
)
def test_a_bucket_never_cuts_the_budget_short_and_overshoots_little(remaining: float) -> None:
    seconds = bounds.bucket(remaining)
    assert seconds >= max(remaining, bounds.FLOOR)
    assert seconds <= max(bounds.FLOOR, remaining + bounds.GRAIN, remaining * 2 ** (1 / 8)) + 1e-9


def test_few_buckets_serve_a_long_budget() -> None:
    buckets = {bounds.bucket(tenth / 10) for tenth in range(600)}
    # multiples of GRAIN up to FINE_UP_TO, then 8 per doubling
    assert len(buckets) <= 7 + bounds.STEPS_PER_DOUBLING * math.ceil(math.log2(60 / 2))


def test_a_client_whose_socket_timeout_is_short_enough_runs_as_it_is() -> None:
    client = redis.Redis(socket_timeout=0.3, retry=None)  # no Retry: as django-redis's pools
    assert bounds.Limits().get(client, 5.0) is None
    assert bounds.Limits().fits(client, 0.9, 3)
    assert not bounds.Limits().fits(client, 0.8, 3)  # a script's three round trips


@pytest.mark.parametrize("socket_timeout", [None, 30.0])
def test_a_client_with_a_longer_socket_timeout_is_bounded_by_the_bucket(
    socket_timeout: float | None,
) -> None:
    client = redis.Redis(port=1, socket_timeout=socket_timeout, db=3)
    limits = bounds.Limits()
    assert limits.get(client, 4.0) == bounds.bucket(4.0)
    assert limits.get(client, 4.0 - 1e-6) == bounds.bucket(4.0)  # same bucket
    assert limits.get(client, 0.1) == bounds.FLOOR


def test_a_pool_of_ones_own_is_bounded_like_any_other() -> None:
    class CustomPool(redis.ConnectionPool):
        pass

    client = redis.Redis(connection_pool=CustomPool())
    assert bounds.Limits().get(client, 1.0) == 1.0
    assert bounds.own_socket_timeout(client) == made_timeout(client)


def test_bounded_commands_open_no_connection_beyond_the_cache_pool(redis_url: str) -> None:
    """A pool of our own per timeout bucket (a "sibling") once multiplied the
    process's connections by the buckets in use, each with the cache pool's
    cap. A bounded command now runs on the cache's own pool, in the caller's
    thread or on a worker: with every budget from 0.1 s to 30 s, the server
    sees at most the pool's cap."""
    from django_redislock.backend.scripts import LOCK_TAKE
    from django_redislock.engine import drivers

    # every connection a copy of this pool would open carries the name too
    client = redis.Redis.from_url(f"{redis_url}?client_name=bounded", socket_timeout=30,
                                  max_connections=3)  # fmt: skip
    probe = redis.Redis.from_url(redis_url)
    try:
        for tenth in range(1, 300, 7):
            deadline = time.monotonic() + tenth / 10
            call = Call(LOCK_TAKE, [f"bounded:{tenth}"], ["v", 1000], deadline=deadline)
            assert drivers.perform(call, client)
        mine = [c for c in probe.client_list() if c["name"] == "bounded"]
        assert 1 <= len(mine) <= 3
    finally:
        client.close()
        probe.close()


def made_timeout(client: redis.Redis) -> float:
    """The socket timeout a connection of ``client``'s pool really gets."""
    connection = client.connection_pool.make_connection()
    try:
        return connection.socket_timeout or math.inf
    finally:
        connection.disconnect()


@pytest.mark.parametrize(
    "kwargs", [{}, {"socket_timeout": None}, {"socket_timeout": 2.5}], ids=["unset", "none", "2.5"]
)
def test_own_socket_timeout_is_what_the_connections_get(kwargs: dict[str, Any]) -> None:
    """redis-py 8 gives a connection 5 s when no socket_timeout is passed;
    earlier versions none. Either way, what a connection really gets."""
    client = redis.Redis(port=free_port(), **kwargs)
    assert bounds.own_socket_timeout(client) == made_timeout(client)
    if "socket_timeout" in kwargs:
        assert bounds.own_socket_timeout(client) == (kwargs["socket_timeout"] or math.inf)


def test_a_connection_class_of_ones_own_has_its_default_read_from_its_signature() -> None:
    class Patient(redis.Connection):
        def __init__(self, *args: Any, socket_timeout: float | None = 42.0, **kw: Any) -> None:
            super().__init__(*args, socket_timeout=socket_timeout, **kw)

    client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=Patient))
    assert bounds.own_socket_timeout(client) == made_timeout(client) == 42.0


def test_a_worker_answers_or_times_out_without_waiting_for_the_command() -> None:
    workers = bounds.Workers()
    assert workers.call(1.0, max, 2, 5) == 5
    stuck = threading.Event()
    try:
        with pytest.raises(TimeoutError):
            workers.call(0.05, stuck.wait, 30)
    finally:
        stuck.set()  # the hung command ends when Redis (here: the event) answers
    with pytest.raises(ZeroDivisionError):  # the command's own error reaches the caller
        workers.call(1.0, divmod, 1, 0)


def test_the_janitor_sends_a_clean_up_only_after_the_abandoned_command_ended() -> None:
    sent: list[str] = []
    running = concurrent.futures.Future[None]()
    janitor = janitor_module.Janitor()
    cleanup = Call(lambda client, keys, args: sent.append("clean-up"), [], [])
    janitor.submit(redis.Redis(port=1), cleanup, after=running)
    assert not janitor.wait_idle(0.3)  # the abandoned command may still reach Redis
    assert sent == []
    running.set_result(None)
    assert janitor.wait_idle(10)
    assert sent == ["clean-up"]


def test_dropped_clean_ups_are_forgotten_the_one_in_hand_too() -> None:
    """For the test rig: a clean-up for a server a test stopped is retried for
    two minutes, and a later test waiting for the janitor to idle waited for it."""
    tried = threading.Event()

    def refused(client: Any, keys: Any, args: Any) -> None:
        tried.set()
        raise redis.ConnectionError("refused")

    janitor = janitor_module.Janitor()
    janitor.submit(redis.Redis(port=1), Call(refused, [], []))
    assert tried.wait(5)  # in hand: failed, about to be tried again
    assert not janitor.wait_idle(0.1)
    janitor.drop_pending()
    assert janitor.wait_idle(10)
    assert janitor.pending() == 0


class OwnPool(redis.ConnectionPool):
    """A pool class of the project's own (bounded steps run on worker threads)."""


@pytest.mark.usefixtures("real_redis")  # blocked_clients, from INFO
def test_waiters_share_one_blocked_connection_and_hold_up_no_other_acquire(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every waiter of a process waits on one shared wake-up connection
    (``engine/wakeups.py``): with more waiters than worker threads, Redis sees
    one blocked client, and an uncontended acquire of another name on the
    same healthy server is not held up by them. (Their ``BLPOP``s once ran on
    the commands' workers, 16 per server, and such an acquire queued behind
    them, up to a wait chunk, and gave up with ``LockBackendTimeout``.)"""
    from django.test import override_settings

    from django_redislock import Lock
    from django_redislock.engine.wakeups import wakeups
    from tests.settings import redis_cache
    from tests.support.other_holders import OtherThread

    monkeypatch.setattr(
        "django_redislock.backend.client.MAX_WAIT_CHUNK", 10.0
    )  # long waits: a late command shows
    caches = {
        # a URL of its own: django-redis keeps one pool per URL, whatever its class
        "default": redis_cache(
            f"{redis_url}?client_name=crowd",
            SOCKET_TIMEOUT=None,
            CONNECTION_POOL_CLASS=f"{__name__}.OwnPool",
        )
    }
    waiters, queue = 2 * bounds.MAX_WORKERS, "redislock:{crowd}:queue"
    holder_thread = OtherThread()
    with override_settings(CACHES=caches):
        holder = Lock("crowd", timeout=60)
        assert holder_thread(holder.acquire, blocking=False)
        errors: list[BaseException] = []

        def wait_in_line() -> None:
            try:
                with Lock("crowd", timeout=60, blocking_timeout=40):
                    pass
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=wait_in_line) for _ in range(waiters)]
        try:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 20
            while redis_client.zcard(queue) < waiters or wakeups.waiters() < waiters:
                assert time.monotonic() < deadline, "the waiters never all waited"
                time.sleep(0.01)
            # this process's shared wake-up connection; between two of its
            # BLPOPs (a nudge for the last waiter that joined), none for a moment
            while (blocked := _blocked(redis_client, "crowd")) != 1:
                assert blocked == 0, f"{blocked} connections blocked"
                assert time.monotonic() < deadline, "the wake-up connection never blocked"
                time.sleep(0.01)
            started = time.monotonic()
            other = Lock("other", blocking_timeout=3)
            assert other.acquire(), "an uncontended acquire waited for the waiters' threads"
            other.release()
            assert time.monotonic() - started < 2.0
        finally:
            holder_thread(holder.release)
            holder_thread.close()
            for thread in threads:
                thread.join(60)
    assert errors == []
    assert redis_client.zcard(queue) == 0


def _blocked(client: redis.Redis, name: str) -> int:
    """Clients named ``name`` blocked in a command now."""
    return sum(c["name"] == name and "b" in c["flags"] for c in client.client_list())
