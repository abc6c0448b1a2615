"""Every acquire ends by ``blocking_timeout`` + ``bounds.FLOOR``, whatever way Redis hangs.

Each test drives one path by which an acquire once ended past its bound (a
nemesis run saw 1.62 s for ``blocking_timeout`` 1.11 on a partition) and
asserts the bound itself, with no slack on top: the steps aim at the bound
less ``bounds.BOUND_MARGIN``, which is there for what an acquire still does
after its last step gave up (raising, handing the clean-up to the janitor).

- a re-check sent at the deadline, in the caller's thread under a socket
  timeout equal to the floor (it ended at the bound plus the raising);
- a step sent with little or nothing left of the floor (it was given
  ``MIN_STEP`` past the bound), a clean-up among them;
- a client whose connections retry a timed-out command (redis-py 6+'s
  ``redis.Redis()``): its socket timeout bounds one try, not the command;
- a wait for a free connection of a full pool, whose end became the step's
  deadline;
- the asyncio clean-up, which waited a floor past the deadline;
- a script whose ``NOSCRIPT`` reload took three slow round trips, each under
  the socket timeout, in the caller's thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_redislock import Lock, LockBackendError, LockTimeout, Semaphore
from django_redislock.backend import client as backend
from django_redislock.engine import bounds, drivers
from django_redislock.engine import janitor as janitor_module
from django_redislock.engine.steps import Call, Step
from django_redislock.exceptions import LockBackendTimeout
from tests.engine.test_hung_server import (
    ASYNC,
    PARTS,
    SYNC,
    Pausable,
    _pause_once_queued,
    settings_for,
)
from tests.settings import redis_cache
from tests.support.clients import LIB
from tests.support.faultproxy import FaultProxy
from tests.support.other_holders import OtherThread
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("real_redis")]

#: Below the wait chunk (half a 0.5 s socket timeout): the waiter's one wait
#: runs to its deadline, and its re-check is sent there.
SHORT = 0.2


@pytest.fixture
def paused(redis_server_factory: Callable[..., RedisServer]) -> Iterator[Pausable]:
    """A private server to pause (``test_hung_server``'s), resumed and its clean-ups delivered."""
    server = Pausable(redis_server_factory())
    try:
        yield server
    finally:
        server.resume()
        assert janitor_module.janitor.wait_idle(15), "a clean-up was never delivered"
        server.client.close()


def within_bound(started: float, budget: float) -> float:
    elapsed = time.monotonic() - started
    assert elapsed <= budget + bounds.FLOOR, f"{elapsed:.3f} s for a budget of {budget} s"
    return elapsed


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", list(SYNC))
def test_a_recheck_at_the_deadline_under_a_socket_timeout_of_the_floor_ends_within_the_bound(
    paused: Pausable, kind: str, mode: str
) -> None:
    """The nemesis's case: with ``SOCKET_TIMEOUT`` 0.5 s the re-check after a
    wait ran in the caller's thread, bounded by the socket timeout only: sent
    at the deadline, it ended at the bound, and the acquire raised after it."""
    holder_thread = OtherThread()
    with settings_for(paused, bounds.FLOOR):
        holder = SYNC[kind]()
        try:
            assert holder_thread(holder.acquire, blocking=False)
            pauser = _pause_once_queued(paused, kind)
            started = time.monotonic()
            with pytest.raises(LockBackendTimeout):
                if mode == "async":
                    asyncio.run(ASYNC[kind](blocking_timeout=SHORT).acquire())
                else:
                    SYNC[kind](blocking_timeout=SHORT).acquire()
            elapsed = within_bound(started, SHORT)
            pauser.join(1)
            assert paused.paused, "the server was not paused while the waiter waited"
            assert elapsed >= SHORT - 0.05
            paused.resume()
            assert janitor_module.janitor.wait_idle(15)
            assert paused.client.zcard(paused.key(PARTS[kind][1])) == 0, "the waiter stayed queued"
            holder_thread(holder.release)
        finally:
            paused.resume()
            holder_thread.close()


class Ping:
    """A step's script that only pings, on a sync client or an asyncio one;
    ``delivered`` once it was answered."""

    def __init__(self) -> None:
        self.delivered = threading.Event()

    def __call__(self, client: Any, keys: Any, args: Any) -> Any:
        client.ping()
        self.delivered.set()

    async def run_async(self, client: Any, keys: Any, args: Any) -> Any:
        await client.ping()
        self.delivered.set()


def _one(call: Call) -> Generator[Step, Any, Any]:
    return (yield call)


@pytest.mark.parametrize("left", [0.03, 0.2])
def test_a_step_sent_late_past_the_deadline_ends_within_the_bound(
    paused: Pausable, left: float
) -> None:
    """``left``: what was left of the floor when the step was sent; given at
    least ``MIN_STEP`` (0.05 s), a step sent that late ended past the bound."""
    with settings_for(paused, None):
        client = backend.get_client("default")
        client.ping()  # a pooled connection: no set-up to wait for
        paused.pause()
        deadline = time.monotonic() - bounds.FLOOR + left
        with pytest.raises(backend.Unanswered):
            drivers.run(_one(Call(Ping(), [], [], deadline=deadline)), client)
        within_bound(deadline, 0.0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_clean_up_with_no_time_left_is_the_janitors_at_once(paused: Pausable, mode: str) -> None:
    leave = Ping()

    async def run_async(call: Call, client: Any) -> Any:
        return await drivers.run_async(_one(call), drivers.AsyncConnection(client))

    with settings_for(paused, None):
        client = backend.get_client("default")
        client.ping()
        paused.pause()
        # nothing left: the bound, less the margin, has passed
        deadline = time.monotonic() - (bounds.FLOOR - bounds.BOUND_MARGIN) - 0.01
        call = Call(leave, [], [], shield=True, deadline=deadline)
        reply = (
            asyncio.run(run_async(call, client))
            if mode == "async"
            else drivers.run(_one(call), client)
        )
        within_bound(deadline, 0.0)
        assert reply is None and not leave.delivered.is_set()
        paused.resume()
        assert leave.delivered.wait(15), "the janitor never sent the clean-up"


def test_an_asyncio_clean_up_after_the_deadline_waits_only_for_whats_left(
    paused: Pausable,
) -> None:
    """It waited at least the floor from when it was sent, wherever the deadline was."""

    async def main() -> None:
        conn = drivers.AsyncConnection(backend.get_client("default"))
        await conn.call("ping")  # a pooled connection of the mirror
        paused.pause()
        deadline = time.monotonic() - 0.3
        assert await drivers.run_async(_one(Call(Ping(), [], [], True, deadline)), conn) is None
        within_bound(deadline, 0.0)

    with settings_for(paused, None):
        asyncio.run(main())


def _retrying(url: str) -> dict[str, object]:
    """A cache whose connections send a timed-out command again, three times."""
    retry = LIB.retry.Retry(LIB.backoff.NoBackoff(), 3)
    return redis_cache(
        url,
        SOCKET_TIMEOUT=0.3,
        SOCKET_CONNECT_TIMEOUT=0.3,
        CONNECTION_POOL_KWARGS={"retry": retry, "retry_on_timeout": True},
    )


@pytest.mark.parametrize("kind", ["Lock", "Semaphore"])
def test_a_client_that_retries_timeouts_is_bounded_by_the_budget(
    paused: Pausable, kind: str
) -> None:
    """Each try under a 0.3 s socket timeout, four of them (and a connection's
    set-up before each retry) ran in the caller's thread: past a 0.5 s budget's bound."""
    budget = 0.5
    make: Callable[..., Any] = Lock if kind == "Lock" else lambda *a, **kw: Semaphore(*a, 1, **kw)
    with override_settings(CACHES={"default": _retrying(paused.server.url)}):
        assert bounds.retries_timeouts(backend.get_client("default"))
        warm = make("retried", blocking_timeout=budget)
        assert warm.acquire()
        warm.release()
        paused.pause()
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            make("retried", blocking_timeout=budget).acquire()
        within_bound(started, budget)
        paused.resume()


def test_a_first_set_whose_socket_timeout_is_the_budget_stays_in_the_caller_s_thread(
    paused: Pausable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``blocking_timeout`` equal to the socket timeout (5 s and redis-py 8's
    default, the common case): the acquire's plain ``SET`` may end as late
    as any step of it may (``bounds.end_of``), so it runs in the caller's
    thread, not on a worker; on a paused server it still ends in the bound."""
    budget = 1.0
    sent_from_workers: list[object] = []
    real_call = bounds.workers.call

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent_from_workers.append(args[2])  # the script
        return real_call(*args, **kwargs)

    monkeypatch.setattr(bounds.workers, "call", counted)
    with settings_for(paused, budget):
        warm = Lock("first-set", timeout=5, blocking_timeout=budget)
        assert warm.acquire()  # a pooled connection (set up on a worker), the scripts loaded
        warm.release()
        sent_from_workers.clear()
        for _ in range(3):
            with Lock("first-set", timeout=5, blocking_timeout=budget):
                pass
        assert sent_from_workers == []
        paused.pause()
        started = time.monotonic()
        with pytest.raises(LockBackendTimeout):
            Lock("first-set", timeout=5, blocking_timeout=budget).acquire()
        elapsed = within_bound(started, budget)
        assert elapsed >= budget - 0.05  # the socket timeout ended it, not an early give-up
        paused.resume()


def test_a_step_that_waited_for_a_full_pool_ends_within_the_bound(paused: Pausable) -> None:
    """The one connection of the pool comes free after the deadline; the wait
    for it then became the step's deadline, and the step was given the floor
    past it."""
    caches = {
        "default": redis_cache(
            paused.server.url,
            SOCKET_TIMEOUT=None,
            CONNECTION_POOL_KWARGS={"socket_timeout": None, "max_connections": 1},
        )
    }
    with override_settings(CACHES=caches):
        client = backend.get_client("default")
        client.ping()
        pool = client.connection_pool
        taken = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
        paused.pause()
        started = time.monotonic()
        freed = threading.Timer(SHORT + 0.25, pool.release, (taken,))
        freed.start()
        try:
            with pytest.raises(LockTimeout):
                Lock("pooled", blocking_timeout=SHORT).acquire()
            within_bound(started, SHORT)
        finally:
            freed.join(5)
            paused.resume()


def _needs_name(pool: Any) -> bool:
    """redis-py before 5.3 needs a command's name to give a connection."""
    import inspect

    parameter = inspect.signature(pool.get_connection).parameters["command_name"]
    return parameter.default is inspect.Parameter.empty


@pytest.fixture
def slow_proxy(redis_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(redis_url) as running:
        caches = {
            "default": redis_cache(running.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5),
            "direct": redis_cache(redis_url),
        }
        with override_settings(CACHES=caches):
            yield running


def test_a_script_reloaded_on_a_slow_redis_ends_within_the_bound(
    slow_proxy: FaultProxy,
) -> None:
    """After a restart (``SCRIPT FLUSH`` here) the acquire script's ``EVALSHA``
    answers ``NOSCRIPT``, then ``SCRIPT LOAD`` and ``EVALSHA`` again: three
    round trips of 0.48 s, each under the 0.5 s socket timeout, together
    1.44 s in the caller's thread, sent with half of a 1 s budget left."""
    budget = 1.0
    holder = Lock("noscript", timeout=30, using="direct")
    assert holder.acquire(blocking=False)
    try:
        backend.get_client("default").ping()  # a pooled connection through the proxy
        backend.get_client("direct").script_flush()
        slow_proxy.latency = 0.24
        started = time.monotonic()
        with pytest.raises(LockBackendTimeout):
            Lock("noscript", blocking_timeout=budget).acquire()
        within_bound(started, budget)
        slow_proxy.heal()
        assert janitor_module.janitor.wait_idle(15)
        assert not backend.get_client("direct").zcard("redislock:{noscript}:queue")
    finally:
        slow_proxy.heal()
        holder.release()
