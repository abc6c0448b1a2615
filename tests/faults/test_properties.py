"""Hostile input: random interleavings against a model, and fuzzed names.

The state machine drives several holders of one name through random
acquire / release / extend / expire / clear / data-loss steps and checks, after
every step, that Redis agrees with a simple model: at most one owner, the one
the model expects; fencing tokens strictly increasing; nobody but the owner
ever releases. Primitives plug in through a ``PrimitiveAdapter`` (``Lock`` and
``AsyncLock`` here); another primitive needs only an adapter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import unicodedata
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

import pytest
import redis
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_redislock import AsyncLock, Lock, LockLostError, LockNotOwnedError
from django_redislock.backend import client as lock_backend
from django_redislock.ops import inspection
from django_redislock.validation import MAX_NAME_LENGTH
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread

pytestmark = pytest.mark.usefixtures("real_redis")

T = TypeVar("T")
HOLDERS = 3
PREFIX = "redislock"


# --- adapters: one holder of one primitive, driven synchronously -----------------------


class Holder(Protocol):
    """One holder (its own token) of a primitive, as the model sees it."""

    def acquire(self) -> bool: ...
    def release(self) -> None: ...
    def extend(self) -> None: ...
    def owned(self) -> bool: ...
    def fencing_token(self) -> int | None: ...


class PrimitiveAdapter(Protocol):
    """How the state machine makes holders of a primitive and finds its lease key."""

    def holders(self, name: str, count: int) -> list[Holder]: ...
    def lease_key(self, name: str) -> str: ...
    def close(self) -> None: ...


class SyncLockHolder:
    """A ``Lock`` holder is a thread: each holder runs its calls on its own thread."""

    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.thread = OtherThread()

    def acquire(self) -> bool:
        return self.thread(self.lock.acquire, blocking=False)

    def release(self) -> None:
        self.thread(self.lock.release)

    def extend(self) -> None:
        self.thread(self.lock.extend)

    def owned(self) -> bool:
        return self.thread(self.lock.owned)

    def fencing_token(self) -> int | None:
        return self.thread(lambda: self.lock.fencing_token)


class LockAdapter:
    def __init__(self) -> None:
        self.made: list[SyncLockHolder] = []

    def holders(self, name: str, count: int) -> list[Holder]:
        lock = Lock(name, timeout=30, auto_renew=False)  # one object, a thread per holder
        self.made = [SyncLockHolder(lock) for _ in range(count)]
        return list(self.made)

    def lease_key(self, name: str) -> str:
        return lock_backend.key(PREFIX, name, "lock")

    def close(self) -> None:
        for holder in self.made:
            holder.thread.close()


class EventLoopThread:
    """An asyncio loop in a thread, so synchronous test code can drive tasks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_coro(coro), self.loop).result(30)

    def close(self) -> None:
        async def shut_down() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await self.loop.shutdown_asyncgens()  # closes the lock's asyncio clients

        self.run(shut_down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _coro(awaitable: Awaitable[T]) -> T:
    return await awaitable


class AsyncLockHolder:
    """An ``AsyncLock`` holder is a task: each holder serves its calls from its own task."""

    def __init__(self, runner: EventLoopThread, lock: AsyncLock) -> None:
        self.runner = runner
        self.lock = lock
        self.inbox: asyncio.Queue[
            tuple[Callable[[], Awaitable[Any]], concurrent.futures.Future[Any]]
        ] = runner.run(_make_queue())
        runner.loop.call_soon_threadsafe(runner.loop.create_task, self._serve())

    async def _serve(self) -> None:
        while True:
            call, future = await self.inbox.get()
            try:
                future.set_result(await call())
            except Exception as exc:
                future.set_exception(exc)

    def _do(self, call: Callable[[], Awaitable[T]]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.runner.loop.call_soon_threadsafe(self.inbox.put_nowait, (call, future))
        return future.result(30)

    def acquire(self) -> bool:
        return self._do(lambda: self.lock.acquire(blocking=False))

    def release(self) -> None:
        self._do(self.lock.release)

    def extend(self) -> None:
        self._do(self.lock.extend)

    def owned(self) -> bool:
        return self._do(self.lock.owned)

    def fencing_token(self) -> int | None:
        async def token() -> int | None:
            return self.lock.fencing_token

        return self._do(token)


async def _make_queue() -> asyncio.Queue[Any]:
    return asyncio.Queue()


class AsyncLockAdapter:
    def __init__(self) -> None:
        self.runner = EventLoopThread()

    def holders(self, name: str, count: int) -> list[Holder]:
        lock = AsyncLock(name, timeout=30, auto_renew=False)  # one object, a task per holder
        return [AsyncLockHolder(self.runner, lock) for _ in range(count)]

    def lease_key(self, name: str) -> str:
        return lock_backend.key(PREFIX, name, "lock")

    def close(self) -> None:
        self.runner.close()


# --- the model ------------------------------------------------------------------------


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"])


class ExclusiveMachine(RuleBasedStateMachine):
    """Several holders of one exclusive primitive against a model of who holds it."""

    make_adapter: ClassVar[Callable[[], PrimitiveAdapter]]

    def __init__(self) -> None:
        super().__init__()
        self.adapter = type(self).make_adapter()
        self.client = _redis()
        self.name = f"prop:{uuid.uuid4().hex[:8]}"
        self.holders = self.adapter.holders(self.name, HOLDERS)
        self.depth = [0] * HOLDERS  # what each holder believes: its nesting depth
        self.stale = [False] * HOLDERS  # it believes it holds, but the lease is gone
        # levels of lost holds it took and has not released yet (a re-entry
        # found them gone and took the name afresh, or a release of an inner
        # level found the lease gone): each such release raises LockLostError
        self.lost = [0] * HOLDERS
        self.owner: int | None = None  # who Redis says holds it
        self.last_fence = 0

    def teardown(self) -> None:
        try:
            self.client.delete(
                *[lock_backend.key(PREFIX, self.name, p) for p in Lock.parts], self.lease_key
            )
        finally:
            self.client.close()
            self.adapter.close()

    @property
    def lease_key(self) -> str:
        return self.adapter.lease_key(self.name)

    holder = st.integers(min_value=0, max_value=HOLDERS - 1)

    @rule(i=holder)
    def acquire(self, i: int) -> None:
        h = self.holders[i]
        if self.depth[i] and self.stale[i]:
            # asks Redis, which says the hold is gone: it is reported and the
            # acquire is a fresh one; the old hold's levels wait for their release
            self.lost[i] += self.depth[i]
            self.depth[i], self.stale[i] = 0, False
        if self.depth[i]:
            fence = h.fencing_token()
            assert h.acquire()  # reentrant
            assert h.fencing_token() == fence
            self.depth[i] += 1
        elif self.owner is None:
            assert h.acquire()
            fence = h.fencing_token()
            assert fence is not None and fence > self.last_fence
            self.last_fence = fence
            self.owner, self.depth[i] = i, 1
        else:
            assert h.acquire() is False
            if not self.lost[i]:  # else: the lost hold's token, until its release
                assert h.fencing_token() is None

    @rule(i=holder)
    def release(self, i: int) -> None:
        h = self.holders[i]
        if not self.depth[i] and self.lost[i]:
            with pytest.raises(LockLostError):
                h.release()
            self.lost[i] -= 1
        elif not self.depth[i]:
            with pytest.raises(LockNotOwnedError):
                h.release()
        elif self.stale[i]:
            with pytest.raises(LockLostError):
                h.release()
            self.lost[i] += self.depth[i] - 1  # each outer level is told at its release
            self.depth[i], self.stale[i] = 0, False
        else:
            h.release()
            self.depth[i] -= 1
            if not self.depth[i]:
                self.owner = None

    @rule(i=holder)
    def extend(self, i: int) -> None:
        h = self.holders[i]
        if not self.depth[i] and not self.lost[i]:
            with pytest.raises(LockNotOwnedError):
                h.extend()
        elif self.stale[i] or not self.depth[i]:
            with pytest.raises(LockLostError):
                h.extend()
        else:
            h.extend()

    def _lease_gone(self) -> None:
        assert self.owner is not None
        self.stale[self.owner] = True
        self.owner = None

    @precondition(lambda self: self.owner is not None)
    @rule()
    def expire(self) -> None:
        """The lease runs out (as for a holder paused past it)."""
        self.client.pexpire(self.lease_key, 1)
        deadline = time.monotonic() + 5
        while self.client.exists(self.lease_key):
            assert time.monotonic() < deadline, "a 1 ms lease did not expire"
            time.sleep(0.002)
        self._lease_gone()

    @precondition(lambda self: self.owner is not None)
    @rule()
    def clear(self) -> None:
        """An operator force-releases it."""
        assert inspection.clear(self.client, PREFIX, self.name) == 1
        self._lease_gone()

    @precondition(lambda self: self.owner is not None)
    @rule(i=holder)
    def expire_and_take(self, i: int) -> None:
        """The lease runs out and another holder gets in at once: the stale-holder race."""
        self.expire()
        self.acquire(i)

    @rule()
    def lose_all_data(self) -> None:
        """What a restart without persistence does: every key of the name is gone."""
        keys = list(lock_backend.scan(self.client, f"{PREFIX}:{{{self.name}}}:*"))
        if keys:
            self.client.delete(*keys)
        if self.owner is not None:
            self._lease_gone()

    @invariant()
    def redis_agrees_with_the_model(self) -> None:
        owned = [h.owned() for h in self.holders]
        assert owned == [i == self.owner for i in range(HOLDERS)]
        assert bool(self.client.exists(self.lease_key)) == (self.owner is not None)


MACHINE_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@MACHINE_SETTINGS
class LockMachine(ExclusiveMachine):
    make_adapter = LockAdapter


@MACHINE_SETTINGS
class AsyncLockMachine(ExclusiveMachine):
    make_adapter = AsyncLockAdapter


TestLockModel = LockMachine.TestCase
TestAsyncLockModel = AsyncLockMachine.TestCase


# --- concurrent holders: overlap only ever after a lost lease, and the holder is told ----


@settings(max_examples=8, deadline=None, database=None)
@given(
    threads=st.integers(min_value=2, max_value=4),
    rounds=st.integers(min_value=3, max_value=8),
    expire_every=st.one_of(st.none(), st.integers(min_value=2, max_value=5)),
)
def test_concurrent_holders_never_overlap_unless_told(
    threads: int, rounds: int, expire_every: int | None
) -> None:
    name = f"conc:{uuid.uuid4().hex[:8]}"
    key = lock_backend.key(PREFIX, name, "lock")
    client = _redis()
    guard = threading.Lock()
    inside: list[int] = []  # fencing tokens of holders inside their critical section
    overlaps: list[tuple[int, int]] = []  # (older token, newer token) seen together
    told: set[int] = set()  # tokens whose holders were told they lost the lock
    fences: list[int] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            lock = Lock(name, timeout=10, auto_renew=False, blocking_timeout=20)
            for step in range(rounds):
                assert lock.acquire()
                token = lock.fencing_token
                assert token is not None
                with guard:
                    overlaps.extend((other, token) for other in inside)
                    inside.append(token)
                    fences.append(token)
                if expire_every and (index + step) % expire_every == 0:
                    client.pexpire(key, 1)  # lease runs out mid-section
                    while client.exists(key):
                        time.sleep(0.001)
                with guard:
                    inside.remove(token)
                try:
                    lock.release()
                except LockLostError:
                    with guard:
                        told.add(token)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    # A short socket timeout keeps each blocking wait short, so a waiter notices an
    # expired lease (which sends no wake-up) within 0.1 s rather than 2 s.
    caches = {"default": redis_cache(os.environ["REDISLOCK_TEST_REDIS_URL"], SOCKET_TIMEOUT=0.2)}
    with override_settings(CACHES=caches):
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(60)
    client.close()
    assert not errors, errors
    assert len(fences) == threads * rounds
    # tokens are handed out strictly increasing, in the order holders got in
    assert len(set(fences)) == len(fences)
    if expire_every is None:
        assert not overlaps, "two holders inside at once without any lease lost"
    for older, _newer in overlaps:
        assert older in told, "a holder overlapped by a newer one was never told"


# --- fuzzed names ---------------------------------------------------------------------

GLOBS_AND_BRACES = "{}*?[]^!\\%:-_ ./"


def documented_outcome(name: object) -> type[Exception] | None:
    """What docs/api.md promises for ``name``: works (None), or the error to expect."""
    if not isinstance(name, str):
        return TypeError
    if not name or len(name) > MAX_NAME_LENGTH:
        return ValueError
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        return ValueError
    return None


any_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()),  # surrogates included
    max_size=40,
)
tricky_text = st.lists(
    st.sampled_from(
        [
            *GLOBS_AND_BRACES,
            "\x00",
            "\n",
            "\x7f",
            "\x85",
            "é",
            "🔒",
            "\u2028",
            "\ud800",
            "%7B",
            "%25",
            "\u200b",
        ]
    ),
    max_size=30,
).map("".join)
names = st.one_of(
    any_text,
    tricky_text,
    st.sampled_from(
        [
            "",
            "x" * MAX_NAME_LENGTH,
            "x" * (MAX_NAME_LENGTH + 1),
            "é" * MAX_NAME_LENGTH,
            "x" * 1_000_000,
            "}{",
            "a}:lock",
            "*",
        ]
    ),
    st.integers(),
    st.floats(allow_nan=True),
    st.binary(max_size=10),
    st.none(),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=names)
def test_fuzzed_names_give_the_documented_outcome(name: object, redis_url: str) -> None:
    expected = documented_outcome(name)
    if expected is not None:
        with pytest.raises(expected, match="name"):
            Lock(name, timeout=5, auto_renew=False)  # type: ignore[arg-type]
        return
    assert isinstance(name, str)
    lock = Lock(name, timeout=5, auto_renew=False)
    client = redis.Redis.from_url(redis_url)
    try:
        assert lock.acquire(blocking=False)
        other = OtherThread()  # another holder
        try:  # the same name, the same lock
            assert other(Lock(name).acquire, blocking=False) is False
        finally:
            other.close()
        # the key names this lock alone, and tools read the name back unchanged
        [info] = inspection.describe(client, PREFIX, name)
        assert info.name == name
        held = [i.name for i in inspection.list_held(client, PREFIX)]
        assert held == [name]
        lock.release()
        assert not lock.locked()
    finally:
        client.flushall()
        client.close()


@settings(max_examples=40, deadline=None, database=None)
@given(name=names)
def test_fuzzed_names_async(name: object) -> None:
    expected = documented_outcome(name)
    if expected is not None:
        with pytest.raises(expected, match="name"):
            AsyncLock(name)  # type: ignore[arg-type]
        return

    async def round_trip() -> None:
        lock = AsyncLock(name, timeout=5, auto_renew=False)  # type: ignore[arg-type]
        assert await lock.acquire(blocking=False)
        await lock.release()

    runner = EventLoopThread()
    try:
        runner.run(round_trip())
    finally:
        runner.close()
