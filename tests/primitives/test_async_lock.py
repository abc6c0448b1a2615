from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis
from django.test import override_settings

from django_redislock import (
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)
from django_redislock import signals as lock_signals
from django_redislock.backend.values import parse_lock_value
from django_redislock.primitives.async_lock import AsyncConnection
from tests.settings import redis_cache
from tests.support.signals_helper import capture

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    """Poll Redis state that has no event of its own (e.g. "is queued")."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


@pytest.fixture(params=["native", "thread"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run on the asyncio mirror pool and on the worker-thread fallback (``aio=None``),
    which is what Sentinel and Cluster topologies use."""
    if request.param == "thread":
        monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda client: None)
    return str(request.param)


def test_fallback_path_has_no_asyncio_client(path: str, redis_client: redis.Redis) -> None:
    async def main() -> bool:
        return AsyncConnection(redis_client).aio is None

    assert run(main()) is (path == "thread")


def test_acquire_release_owned_locked_ttl_extend(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        lock = AsyncLock("a:1", timeout=5, auto_renew=False)
        assert not await lock.locked()
        assert not await lock.owned()
        assert await lock.ttl() is None
        assert await lock.acquire()
        assert await lock.locked()
        assert await lock.owned()
        assert lock.fencing_token is not None
        ttl = await lock.ttl()
        assert ttl is not None and 0 < ttl <= 5
        await lock.extend(60)
        ttl = await lock.ttl()
        assert ttl is not None and 5 < ttl <= 60
        assert redis_client.exists("redislock:{a:1}:lock")
        await lock.release()
        assert not await lock.locked()
        assert lock.fencing_token is None
        with pytest.raises(LockNotOwnedError):
            await lock.release()
        with pytest.raises(LockNotOwnedError):
            await lock.extend()

    run(main())


def test_nesting_in_one_task(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        lock = AsyncLock("nest")
        async with lock:
            token = lock.fencing_token
            async with lock:
                assert lock.fencing_token == token
                state = parse_lock_value(redis_client.get("redislock:{nest}:lock"))
                assert state is not None and state.count == 2
            assert await lock.locked()
        assert not await lock.locked()

    run(main())


def test_two_tasks_are_two_holders(path: str) -> None:
    async def main() -> None:
        lock = AsyncLock("tasks")
        await lock.acquire()

        async def other() -> tuple[bool, bool]:
            return await lock.acquire(blocking=False), await lock.owned()

        assert await asyncio.create_task(other()) == (False, False)
        assert await lock.owned()
        await lock.release()

    run(main())


async def hold_in_another_task(
    name: str, **options: Any
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Hold ``name`` from a task of its own until the returned event is set."""
    held, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with AsyncLock(name, **options):
            held.set()
            await done.wait()

    task = asyncio.create_task(hold())
    await held.wait()
    return done, task


def test_timeout_raises_lock_timeout_with_retry_after(path: str) -> None:
    async def main() -> None:
        done, holder = await hold_in_another_task("busy", timeout=20)
        with capture(lock_signals.lock_contended) as contended:
            with pytest.raises(LockTimeout) as info:
                async with AsyncLock("busy", blocking_timeout=0.05):
                    pass
        assert info.value.name == "busy"
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
        assert [c["name"] for c in contended] == ["busy"]
        done.set()
        await holder

    run(main())


def test_lost_lease_raises_at_async_with_exit(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        with capture(lock_signals.lock_lost) as lost:
            with pytest.raises(LockLostError):
                async with AsyncLock("lost", auto_renew=False):
                    redis_client.delete("redislock:{lost}:lock")
        assert [c["name"] for c in lost] == ["lost"]

    run(main())


def test_handoff_wakes_a_waiting_task_promptly(path: str, redis_client: redis.Redis) -> None:
    async def main() -> float:
        holder = AsyncLock("handoff", timeout=30)
        await holder.acquire()
        waiter = AsyncLock("handoff", blocking_timeout=20)

        async def wait() -> float:
            async with waiter:
                return time.monotonic()

        task = asyncio.create_task(wait())
        await until(lambda: asyncio.to_thread(redis_client.zcard, "redislock:{handoff}:queue"))
        released = time.monotonic()
        await holder.release()
        return await asyncio.wait_for(task, 20) - released

    # woken by the release: not by the 30 s lease nor the 2 s fallback re-check
    assert run(main()) < 1.0


def test_cancelled_waiter_leaves_no_queue_entry(path: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        holder = AsyncLock("cancel", timeout=30)
        await holder.acquire()
        task = asyncio.create_task(AsyncLock("cancel", blocking_timeout=20).acquire())
        await until(lambda: asyncio.to_thread(redis_client.zcard, "redislock:{cancel}:queue"))
        # Cancel it once it is blocked on its signal: a cancellation that lands
        # while redis.asyncio writes a command can be lost before Python 3.12
        # (see test_a_cancellation_lost_in_a_wait_is_honoured).
        await until(lambda: asyncio.to_thread(blocked_clients, redis_client))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert redis_client.zcard("redislock:{cancel}:queue") == 0
        await holder.release()
        # nobody is left in line: a newcomer gets the free lock at once
        assert await AsyncLock("cancel").acquire(blocking=False)

    run(main())


def test_signals_and_fencing(path: str) -> None:
    async def main() -> None:
        tokens = []
        with (
            capture(lock_signals.lock_acquired) as acquired,
            capture(lock_signals.lock_released) as released,
        ):
            for _ in range(3):
                async with AsyncLock("sig", fencing=True) as lock:
                    tokens.append(lock.fencing_token)
        assert [c["fencing_token"] for c in acquired] == tokens
        assert all(c["sender"] is AsyncLock and c["kind"] == "lock" for c in acquired)
        assert len(released) == 3
        assert tokens == sorted(tokens) and len(set(tokens)) == 3

    run(main())


def test_a_fencing_token_taken_on_first_use_is_awaitable(path: str) -> None:
    # Contract change (lean Lock): without fencing=True the acquire takes no
    # token (lock_acquired says None); the first use takes one, awaited or not.
    async def main() -> None:
        tokens: list[int | None] = []
        with capture(lock_signals.lock_acquired) as acquired:
            async with AsyncLock("sig-lazy", fencing=True) as first:
                tokens.append(first.fencing_token)
            async with AsyncLock("sig-lazy") as lock:
                token = await lock.get_fencing_token()
                assert lock.fencing_token == token  # the same token, no round trip
                tokens.append(token)
            async with AsyncLock("sig-lazy") as lock:
                tokens.append(lock.fencing_token)  # the property: one blocking round trip
        assert [c["fencing_token"] for c in acquired] == [tokens[0], None, None]
        assert None not in tokens and tokens == sorted(tokens) and len(set(tokens)) == 3
        assert await AsyncLock("sig-lazy").get_fencing_token() is None  # not held

    run(main())


def test_watchdog_renews_async_holds(path: str) -> None:
    async def main() -> None:
        # a 1.2 s lease: a 0.6 s one was lost in CI when a loaded VM held up
        # one 0.2 s renewal past the lease's end
        lock = AsyncLock("long", timeout=1.2)
        async with lock:
            await asyncio.sleep(4.0)  # more than three leases
            assert await lock.owned()

    run(main())


def test_a_nested_acquire_after_the_lease_was_lost_takes_it_afresh(
    path: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        lock = AsyncLock("nest-lost", auto_renew=False)
        with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError):
            async with lock:  # told at its exit that its hold was lost
                first = lock.fencing_token
                redis_client.delete("redislock:{nest-lost}:lock")
                with pytest.raises(LockLostError):
                    await lock.extend()
                async with AsyncLock("nest-lost", blocking_timeout=0) as inner:
                    # asked Redis, not the task's stale record: a hold of its own
                    assert await inner.owned()
                    assert inner.fencing_token is not None and first is not None
                    assert inner.fencing_token > first
                    state = parse_lock_value(redis_client.get("redislock:{nest-lost}:lock"))
                    assert state is not None and state.count == 1
                assert not await lock.owned()
        assert [call["name"] for call in lost] == ["nest-lost"]
        assert not await lock.locked()

    run(main())


def test_another_async_lock_in_the_holding_task_reenters(path: str) -> None:
    async def main() -> None:
        async with AsyncLock("task-holds") as outer:
            async with AsyncLock("task-holds", blocking_timeout=0) as inner:
                assert inner.fencing_token == outer.fencing_token
                assert await inner.owned()

            async def child() -> bool:  # a task never inherits its parent's holds
                return await AsyncLock("task-holds").acquire(blocking=False)

            assert await asyncio.create_task(child()) is False
            assert await outer.locked()
        assert not await outer.locked()

    run(main())


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 does not count cancellation requests"
)
@pytest.mark.parametrize(
    ("make", "queue"),
    [
        (lambda **kw: AsyncLock("lost-cancel", **kw), "redislock:{lost-cancel}:queue"),
        (lambda **kw: AsyncSemaphore("lost-cancel", 1, **kw), "redislock:{lost-cancel}:sem:queue"),
    ],
    ids=["AsyncLock", "AsyncSemaphore"],
)
def test_a_cancellation_lost_in_a_wait_is_honoured(
    make: Callable[..., Any], queue: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Python 3.12 ``asyncio.wait_for`` can return normally when its
    task is cancelled (redis.asyncio writes each command under it, and a wait
    is a ``wait_for`` on the shared wake-up connection's future); a waiter
    must still stop waiting, leave the queue and raise ``CancelledError``."""
    waiting = asyncio.Event()

    async def wait_losing_cancellation(self: Any, timeout: float) -> None:
        waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return  # what wait_for does when the result has just come
        return

    monkeypatch.setattr(
        "django_redislock.engine.wakeups.AsyncWaiter.wait", wait_losing_cancellation
    )

    async def main() -> None:
        holder = make(timeout=30)
        await holder.acquire()
        task = asyncio.create_task(make(blocking_timeout=20).acquire())
        await asyncio.wait_for(waiting.wait(), 10)
        assert redis_client.zcard(queue) == 1  # queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)  # not after the 20 s blocking timeout
        assert redis_client.zcard(queue) == 0
        await holder.release()

    run(main())


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 does not count cancellation requests"
)
@pytest.mark.parametrize(
    ("make", "held"),
    [
        (lambda **kw: AsyncLock("lost-cancel", **kw), "redislock:{lost-cancel}:lock"),
        (lambda **kw: AsyncSemaphore("lost-cancel", 1, **kw), "redislock:{lost-cancel}:semaphore"),
        (
            lambda **kw: AsyncReadWriteLock("lost-cancel", **kw).write(),
            "redislock:{lost-cancel}:rwlock",
        ),
    ],
    ids=["AsyncLock", "AsyncSemaphore", "AsyncReadWriteLock"],
)
def test_a_cancellation_lost_in_an_attempt_is_honoured(
    make: Callable[..., Any], held: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in a wait (above), so in an attempt: a cancellation lost while
    redis.asyncio wrote the acquire script (Python 3.11) let the acquire
    return held, and the cancelled task ran on as if never cancelled (a
    permit waiter woken sends such an attempt after every wake-up). It must
    raise ``CancelledError`` and give the grant back."""
    real_run = AsyncConnection.run
    sending = asyncio.Event()

    async def run_losing_cancellation(
        self: AsyncConnection, script: Any, keys: Any, args: Any
    ) -> Any:
        # a Lock's uncontended acquire is its plain SET (LOCK_TAKE), no script
        acquires = ("SET", "lock_acquire.lua", "semaphore_acquire.lua", "rwlock_acquire.lua")
        if script.name not in acquires:
            return await real_run(self, script, keys, args)
        sending.set()
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for, the write just done
            await asyncio.sleep(30)
        return await real_run(self, script, keys, args)

    monkeypatch.setattr(
        "django_redislock.primitives.async_lock.AsyncConnection.run", run_losing_cancellation
    )

    async def main() -> None:
        task = asyncio.create_task(make(timeout=30).acquire())
        await asyncio.wait_for(sending.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert not redis_client.exists(held), "the grant of a cancelled acquire was kept"
        assert await make().acquire(blocking=False)  # free for the next one

    run(main())


def test_a_cancellation_in_an_inner_release_still_frees_the_lock_at_the_outer(
    redis_client: redis.Redis,
) -> None:
    """The cancellation lands while the inner ``async with`` awaits its
    (shielded) release: the inner level is left, so the outer release is the
    last one and frees the lock. Before, it went as an inner release and the
    lock stayed held after both blocks, renewed by the watchdog."""

    async def main() -> None:
        lock = AsyncLock("inner-cancelled", timeout=60)

        async def hold() -> None:
            async with lock:
                async with lock:
                    me = asyncio.current_task()
                    assert me is not None
                    # delivered once the inner __aexit__ awaits its release
                    asyncio.get_running_loop().call_soon(me.cancel)

        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(hold())
        assert not await AsyncLock("inner-cancelled").locked()

    asyncio.run(main())
    assert not redis_client.exists("redislock:{inner-cancelled}:lock")


@pytest.mark.parametrize("kind", ["AsyncLock", "AsyncSemaphore"])
def test_a_release_cancelled_as_the_loop_ends_still_reaches_redis(
    redis_client: redis.Redis, redis_url: str, kind: str
) -> None:
    """The cancellation lands in the release of the last ``async with`` and
    the loop ends right after (``asyncio.run``'s coroutine returns, as a
    script's or a per-request loop's does): ``asyncio.run`` cancels the
    shielded release with every task left. Before, it never reached Redis
    and the name stayed held by nobody for its whole lease."""
    from django_redislock import AsyncSemaphore

    make, key = {
        "AsyncLock": (lambda: AsyncLock("loop-end", timeout=60), "redislock:{loop-end}:lock"),
        "AsyncSemaphore": (
            lambda: AsyncSemaphore("loop-end-s", 1, timeout=60),
            "redislock:{loop-end-s}:semaphore",
        ),
    }[kind]

    async def main() -> None:
        try:
            async with make():
                await asyncio.sleep(0.1)  # the pooled connection is due a health check
                me = asyncio.current_task()
                assert me is not None
                asyncio.get_running_loop().call_soon(me.cancel)  # lands in the release
        except asyncio.CancelledError:
            pass  # a script that exits, a view that answers

    # The health check (a PING before the release is written) makes sure the
    # cancellation lands before the release is on the wire. A URL of its own:
    # django-redis shares a pool between caches with the same URL.
    cache = redis_cache(
        f"{redis_url}?client_name=loop-end",
        CONNECTION_POOL_KWARGS={"health_check_interval": 0.05},
    )
    with override_settings(CACHES={"default": cache}):
        asyncio.run(main())
    assert not redis_client.exists(key), f"held by nobody for {redis_client.pttl(key)} ms"


@pytest.mark.parametrize(
    ("blocking_timeout", "socket_timeout"),
    [(None, 5.0), (5.0, 5.0), (5.0, None)],
    ids=["unbounded", "bounded", "bounded-on-a-worker"],
)
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_cancelled_acquire_on_a_worker_thread_is_undone_after_it_reaches_redis(
    redis_client: redis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    blocking_timeout: float | None,
    socket_timeout: float | None,
) -> None:
    """Sentinel and Cluster have no asyncio client: an acquire runs on a
    worker thread, and a cancelled one may not be on the wire yet (a connect,
    a busy executor). Its clean-up must follow it: before, it was sent at
    once on another thread, found nothing, and the late acquire left the
    name held by nobody for its whole lease. With a socket timeout longer
    than the budget the step is bounded (``drivers._within``); on Python
    3.10 that bound (``asyncio.wait_for``) ran it in a task of its own and
    raised a cancellation of its own, without the command to follow."""
    import threading

    from django_redislock import AsyncSemaphore
    from django_redislock.backend.scripts import LOCK_TAKE, SEMAPHORE_ACQUIRE, Command, Script
    from django_redislock.engine import janitor as janitor_module

    monkeypatch.setattr("django_redislock.backend.aio.mirror", lambda client: None)
    reals = {Script: Script.__call__, Command: Command.__call__}
    entered, go, sent = threading.Event(), threading.Event(), threading.Event()

    def held_back(script: Script, client: Any, keys: Any, args: Any) -> Any:
        real = reals[type(script)]
        # a Lock's uncontended acquire is its plain SET (LOCK_TAKE)
        if script not in (LOCK_TAKE, SEMAPHORE_ACQUIRE) or entered.is_set():
            return real(script, client, keys, args)
        entered.set()
        go.wait(10)  # not on the wire yet when the caller gives up
        try:
            return real(script, client, keys, args)
        finally:
            sent.set()

    monkeypatch.setattr("django_redislock.backend.scripts.Script.__call__", held_back)
    monkeypatch.setattr("django_redislock.backend.scripts.Command.__call__", held_back)
    name = f"thread-cancel-{kind}-{blocking_timeout}"
    prim = AsyncLock(name, timeout=60) if kind == "lock" else AsyncSemaphore(name, 1, timeout=60)

    async def main() -> None:
        task = asyncio.create_task(prim.acquire(blocking_timeout=blocking_timeout))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go.set()
        assert await asyncio.to_thread(sent.wait, 10)

    # a URL of its own: django-redis keeps one pool per URL, whatever its options
    url = f"{redis_url}?client_name=worker-cancel-{socket_timeout}"
    with override_settings(CACHES={"default": redis_cache(url, SOCKET_TIMEOUT=socket_timeout)}):
        asyncio.run(main())
    # its own clean-up, not the janitor idle: an earlier test's, for a server
    # it stopped, may be retried for a while (the janitor takes them in turn)
    key = f"redislock:{{{name}}}:{kind}"
    deadline = time.monotonic() + 15
    while redis_client.exists(key) and time.monotonic() < deadline:
        janitor_module.janitor.wait_idle(0.2)
    assert not redis_client.exists(key), f"held by nobody for {redis_client.pttl(key)} ms"


@pytest.mark.parametrize("kind", ["AsyncLock", "AsyncSemaphore"])
def test_a_task_that_ends_holding_is_renewed_no_more(kind: str) -> None:
    """As a thread that ends holding: its lease runs out. Before, a finished
    task still referenced (a list of jobs) kept its hold renewed for good."""
    import gc

    from django_redislock import AsyncSemaphore
    from django_redislock.holds.watchdog import watchdog

    prim = AsyncLock("task-ended") if kind == "AsyncLock" else AsyncSemaphore("task-ended-s", 2)

    async def main() -> None:
        before = watchdog.watching()
        jobs = [asyncio.create_task(prim.acquire())]
        assert await asyncio.gather(*jobs) == [True]
        await asyncio.sleep(0)  # the task's done callbacks run on the next pass
        gc.collect()
        assert jobs[0].done()  # and still referenced
        assert watchdog.watching() == before

    asyncio.run(main())


def test_a_long_lived_task_keeps_nothing_per_handle() -> None:
    """A worker task that takes a new handle per job (``async with
    AsyncLock(f"job:{id}")``): one done callback for the task, not one per
    handle (they piled up, about 450 bytes a job, until the task ended)."""
    import gc

    from django_redislock.holds.registry import task_registry

    async def worker() -> tuple[int, int]:
        me = asyncio.current_task()
        assert me is not None
        for job in range(200):
            async with AsyncLock(f"job:{job % 20}"):
                pass
        gc.collect()
        return len(me._callbacks), len(task_registry("AsyncLock").handles)  # type: ignore[attr-defined]

    callbacks, handles = asyncio.run(worker())
    assert callbacks <= 3, callbacks  # asyncio.run's own, and ours
    assert handles <= 2, handles  # the handles still alive, not every one ever used


#: A script on Cluster or Sentinel (no asyncio client: the acquire runs on a
#: worker thread) cancels an acquire that Redis ran while its reply was on
#: its way, then exits at once.
CANCEL_THEN_EXIT = """\
import asyncio, os, sys, threading
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislock import AsyncLock
from django_redislock.backend import aio as async_clients
from django_redislock.backend.scripts import LOCK_TAKE, Command

async_clients.mirror = lambda client: None
real, ran, go = Command.__call__, threading.Event(), threading.Event()

def reply_late(script, client, keys, args):
    result = real(script, client, keys, args)
    if script is LOCK_TAKE and not ran.is_set():
        ran.set()
        go.wait(10)  # Redis ran it; the caller gives up before the reply
    return result

Command.__call__ = reply_late

async def main():
    task = asyncio.create_task(AsyncLock({name!r}, timeout=60).acquire(blocking_timeout={bt}))
    assert await asyncio.to_thread(ran.wait, 10)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    go.set()

asyncio.run(main())
"""


@pytest.mark.parametrize("blocking_timeout", [None, 5.0], ids=["unbounded", "bounded"])
def test_a_cancelled_acquires_clean_up_is_sent_before_the_process_exits(
    redis_client: redis.Redis, blocking_timeout: float | None
) -> None:
    """The clean-up waits for the acquire's command on the janitor, a daemon
    thread: the exit waits for it (at most CLEANUP_AT_EXIT)."""
    import os
    import subprocess

    from tests.support.procs import worker_env

    name = f"cancel-then-exit-{blocking_timeout}"
    code = CANCEL_THEN_EXIT.format(name=name, bt=blocking_timeout)
    env = {**os.environ, **worker_env()}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    key = f"redislock:{{{name}}}:lock"
    assert not redis_client.exists(key), f"held by nobody for {redis_client.pttl(key)} ms"


def test_a_release_resent_as_the_loop_ends_gives_up_on_a_hung_redis(redis_url: str) -> None:
    """The resend (see the test above) is bounded: on a Redis that stopped
    answering, with no socket timeout, ``asyncio.run`` still returns."""
    from tests.support.faultproxy import FaultProxy

    async def main(proxy: FaultProxy) -> None:
        try:
            async with AsyncLock("hung-at-exit", timeout=60):
                proxy.blackhole()
                me = asyncio.current_task()
                assert me is not None
                asyncio.get_running_loop().call_soon(me.cancel)  # lands in the release
        except asyncio.CancelledError:
            pass

    with FaultProxy(redis_url) as proxy:
        cache = redis_cache(proxy.url, SOCKET_TIMEOUT=None, SOCKET_CONNECT_TIMEOUT=None)
        started = time.monotonic()
        with override_settings(CACHES={"default": cache}):
            asyncio.run(main(proxy))
        assert time.monotonic() - started < 15
        proxy.heal()


# a task's holds survive asgiref copying a thread's context back into it -------------


def test_a_task_still_reenters_its_hold_after_a_sync_to_async_round_trip() -> None:
    """``sync_to_async`` copies the thread's context variables back into the
    task; a task ``async_to_sync`` ran in that thread had set its own registry
    there, and the task's holds were lost from sight: a nested acquire waited
    on its own hold (found by a review)."""
    from asgiref.sync import async_to_sync, sync_to_async

    async def other_lock() -> None:
        async with AsyncLock("roundtrip:other"):
            pass

    def sync_helper() -> None:  # an ORM helper that calls async code back
        async_to_sync(other_lock)()

    async def main() -> None:
        async with AsyncLock("roundtrip", blocking_timeout=1) as outer:
            await sync_to_async(sync_helper)()
            async with AsyncLock("roundtrip", blocking_timeout=1) as inner:  # nests
                assert inner.fencing_token == outer.fencing_token

    asyncio.run(main())


def test_require_lock_nests_after_a_sync_to_async_round_trip() -> None:
    from asgiref.sync import async_to_sync, sync_to_async

    from django_redislock import require_lock

    async def other_lock() -> None:
        async with AsyncLock("roundtrip:other2"):
            pass

    @require_lock("roundtrip:job", blocking_timeout=1, on_contention="raise")
    async def job(depth: int) -> str:
        if depth == 0:
            await sync_to_async(lambda: async_to_sync(other_lock)())()
            return await job(1)
        return "ok"

    assert asyncio.run(job(0)) == "ok"


def test_a_handle_used_outside_any_event_loop_says_so() -> None:
    """Not asyncio's "no running event loop": the error names the primitive."""
    lock = AsyncLock("outside")
    with pytest.raises(RuntimeError, match="AsyncLock must be used from inside an asyncio task"):
        lock.fencing_token  # noqa: B018
