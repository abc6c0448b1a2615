"""Regressions found in review: receivers that raise, a renewal racing a release,
and acquires interrupted after Redis granted them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from django_redislock import AsyncLock, Lock
from django_redislock import signals as lock_signals
from django_redislock.backend.scripts import Script
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives import async_lock as async_locks
from django_redislock.primitives import lock_common as lock_steps
from tests.support.other_holders import OtherThread


def cancel_once_acquire_ran(monkeypatch: pytest.MonkeyPatch, acquire: Script) -> None:
    """Cancel an ``AsyncLock`` acquire just after Redis ran ``acquire`` (its
    plain SET, or its script when it took its fencing token up front)."""
    real_run = async_locks.AsyncConnection.run

    async def ran_then_cancelled(self: Any, script: Any, keys: Any, args: Any) -> Any:
        result = await real_run(self, script, keys, args)
        if script is acquire:
            raise asyncio.CancelledError
        return result

    monkeypatch.setattr(
        "django_redislock.primitives.async_lock.AsyncConnection.run", ran_then_cancelled
    )


class RanThenInterrupted:
    """A script whose run reaches Redis but whose reply never reaches the
    caller (Ctrl-C on the way back); its call spec is the real one's."""

    def __init__(self, real: Script) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __call__(self, *args: Any) -> Any:
        self.real(*args)
        raise KeyboardInterrupt


def _raise(**kwargs: Any) -> None:
    raise RuntimeError("a broken receiver")


def test_a_raising_lock_lost_receiver_does_not_kill_the_watchdog(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    told = threading.Event()
    lock_signals.lock_lost.connect(_raise, weak=False)
    lock_signals.lock_lost.connect(lambda **kw: told.set(), weak=False, dispatch_uid="told")
    try:
        doomed, survivor = Lock("doomed", timeout=0.6), Lock("survivor", timeout=0.6)
        doomed.acquire()
        survivor.acquire()
        redis_client.delete("redislock:{doomed}:lock")
        assert told.wait(5)
        # the same thread keeps renewing the other lease well past its length
        threading.Event().wait(1.5)
        assert survivor.owned()
        survivor.release()
        assert "a broken receiver" in caplog.text
    finally:
        lock_signals.lock_lost.disconnect(_raise)
        lock_signals.lock_lost.disconnect(dispatch_uid="told")


def test_a_raising_lock_acquired_receiver_leaves_no_lock_held() -> None:
    lock_signals.lock_acquired.connect(_raise, weak=False)
    try:
        with Lock("receiver") as lock:
            assert lock.owned()
    finally:
        lock_signals.lock_acquired.disconnect(_raise)
    assert not Lock("receiver").locked()


def test_a_renewal_that_loses_the_race_with_the_release_is_not_a_loss(
    redis_client: redis.Redis,
) -> None:
    lock = Lock("race", timeout=5)
    lock.acquire()
    holding = lock._holding()
    assert holding is not None
    holding.releasing = True  # what release() sets before it sends the script
    redis_client.delete("redislock:{race}:lock")  # the release ran first on the server
    assert holding.renew() is True
    assert holding.lost is None
    holding.end()


#: A Lock's acquire: its plain SET, or its script when fenced up front.
ACQUIRES = pytest.mark.parametrize(
    ("fencing", "acquire"), [(False, "LOCK_TAKE"), (True, "LOCK_ACQUIRE")], ids=["set", "fenced"]
)


@ACQUIRES
def test_an_acquire_interrupted_after_the_grant_is_undone(
    monkeypatch: pytest.MonkeyPatch, fencing: bool, acquire: str
) -> None:
    # Redis granted it... but the caller never learned
    monkeypatch.setattr(
        f"django_redislock.primitives.lock_common.{acquire}",
        RanThenInterrupted(getattr(lock_steps, acquire)),
    )
    with pytest.raises(KeyboardInterrupt):
        Lock("interrupted", fencing=fencing).acquire()
    monkeypatch.undo()
    assert not Lock("interrupted").locked()
    assert watchdog.watching() == 0


@ACQUIRES
def test_a_cancelled_async_acquire_after_the_grant_is_undone(
    monkeypatch: pytest.MonkeyPatch, fencing: bool, acquire: str
) -> None:
    cancel_once_acquire_ran(monkeypatch, getattr(lock_steps, acquire))

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await AsyncLock("cancelled", fencing=fencing).acquire()

    asyncio.run(main())
    monkeypatch.undo()
    assert not Lock("cancelled").locked()


@pytest.mark.parametrize("timeout", [0.0005, 1e-9])
def test_a_lease_below_one_millisecond_is_a_value_error(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be at least"):
        Lock("tiny", timeout=timeout)


@pytest.mark.parametrize("timeout", [1e16, 366 * 24 * 3600.0])
def test_a_lease_over_a_year_is_a_value_error(timeout: float) -> None:
    """Not a Redis error at the first acquire (``PX`` out of range)."""
    from django_redislock import ReadWriteLock, Redlock, Semaphore

    for make in (Lock, lambda name, **kw: Semaphore(name, 2, **kw), ReadWriteLock, Redlock):
        with pytest.raises(ValueError, match="timeout must be at most"):
            make("huge", timeout=timeout)


def test_an_extend_over_a_year_is_a_value_error_and_changes_nothing(
    redis_client: redis.Redis,
) -> None:
    """Checked before the lease the watchdog renews by is touched: a bad
    extend must not make every later renewal fail and lose a live hold."""
    with Lock("huge-extend", timeout=30) as lock:
        holding = lock._holding()
        assert holding is not None
        with pytest.raises(ValueError, match="seconds must be at most"):
            lock.extend(1e16)
        assert holding.lease == 30
        assert holding.renew() is True
        assert 0 < redis_client.pttl("redislock:{huge-extend}:lock") <= 30_000


@pytest.mark.parametrize("timeout", [0.0005, 1e16])
def test_require_lock_checks_its_lease_when_it_decorates(timeout: float) -> None:
    """Not on every call (a 500 per request on a view)."""
    from django_redislock import require_lock

    with pytest.raises(ValueError, match="timeout must be at"):
        require_lock("job", timeout=timeout)


def test_clear_without_a_terminal_is_a_command_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.core.management import CommandError, call_command

    def no_terminal(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", no_terminal)
    with Lock("stuck"), pytest.raises(CommandError, match="--noinput"):
        call_command("locks", "clear", "stuck")


@pytest.mark.django_db(transaction=True)
def test_require_lock_inside_a_transaction_holds_until_commit() -> None:
    from django.db import transaction

    from django_redislock import require_lock

    @require_lock("account:<pk>")
    def credit(pk: int) -> None:
        assert Lock(f"account:{pk}").locked()

    with transaction.atomic():
        credit(7)
        # the write made under the lock is not committed yet: still held
        assert Lock("account:7").locked()
    assert not Lock("account:7").locked()

    with pytest.raises(ZeroDivisionError), transaction.atomic():
        credit(8)
        assert Lock("account:8").locked()
        1 / 0  # noqa: B018 - roll back
    assert not Lock("account:8").locked()

    credit(9)  # no transaction: released at once
    assert not Lock("account:9").locked()


def test_an_acquire_interrupted_after_it_queued_leaves_no_queue_entry(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, other_thread: OtherThread
) -> None:
    """The attempt ran (and queued the waiter) but its reply never arrived: the
    waiter did not know it was queued, and must leave the queue all the same."""
    holder = Lock("queued-unawares")
    other_thread(holder.acquire)
    # refused, and queued... but the caller never learned
    monkeypatch.setattr(
        "django_redislock.primitives.lock_common.LOCK_ACQUIRE",
        RanThenInterrupted(lock_steps.LOCK_ACQUIRE),
    )
    with pytest.raises(KeyboardInterrupt):
        Lock("queued-unawares", blocking_timeout=10).acquire()
    monkeypatch.undo()
    assert redis_client.zcard("redislock:{queued-unawares}:queue") == 0
    other_thread(holder.release)
    assert not Lock("queued-unawares").locked()  # nobody was handed it


def test_a_cancelled_async_acquire_after_it_queued_leaves_no_queue_entry(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = Lock("async-unawares")
    holder.acquire()
    cancel_once_acquire_ran(monkeypatch, lock_steps.LOCK_ACQUIRE)  # after its SET failed

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await AsyncLock("async-unawares", blocking_timeout=10).acquire()

    asyncio.run(main())
    monkeypatch.undo()
    assert redis_client.zcard("redislock:{async-unawares}:queue") == 0
    holder.release()


def test_a_semaphore_acquire_interrupted_after_it_queued_leaves_no_queue_entry(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redislock import Semaphore

    holder = Semaphore("sem-unawares", 1)
    holder.acquire()
    waiter = Semaphore("sem-unawares", 1, blocking_timeout=10)
    real = type(waiter).acquire_script

    class QueuedThenInterrupted:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)  # its call spec, for the caller to build the call

        def __call__(self, *args: Any) -> Any:
            real(*args)  # refused, and queued...
            raise KeyboardInterrupt  # ...but the caller never learned

    monkeypatch.setattr(waiter, "acquire_script", QueuedThenInterrupted())
    with pytest.raises(KeyboardInterrupt):
        waiter.acquire()
    assert redis_client.zcard("redislock:{sem-unawares}:sem:queue") == 0
    holder.release()


def _permit(kind: str, name: str, **options: Any) -> Any:
    from django_redislock import ReadWriteLock, Semaphore

    if kind == "Semaphore":
        return Semaphore(name, 1, **options)
    rwlock = ReadWriteLock(name, **options)
    return rwlock.write() if kind == "write" else rwlock.read()


#: Each permit kind's holder key, under ``redislock:{<name>}:``.
PERMIT_HOLDERS = {"Semaphore": "semaphore", "write": "rwlock", "read": "rwlock"}


@pytest.mark.parametrize("blocking", [True, False], ids=["wait", "try"])
@pytest.mark.parametrize("kind", list(PERMIT_HOLDERS))
def test_a_permit_acquire_interrupted_after_the_grant_is_given_back(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str, blocking: bool
) -> None:
    """Redis granted the permit but the caller never learned (Ctrl-C on the
    way back, a reply lost for good): the permit goes back at once instead of
    belonging to nobody for its whole lease."""
    name = f"granted-unawares-{kind}"
    acquirer = _permit(kind, name, timeout=60, blocking=blocking)
    real = type(acquirer).acquire_script

    class GrantedThenInterrupted:
        def __getattr__(self, attr: str) -> Any:
            return getattr(real, attr)  # its call spec, for the caller to build the call

        def __call__(self, *args: Any) -> Any:
            real(*args)  # granted...
            raise KeyboardInterrupt  # ...but the caller never learned

    monkeypatch.setattr(acquirer, "acquire_script", GrantedThenInterrupted())
    with pytest.raises(KeyboardInterrupt):
        acquirer.acquire()
    assert redis_client.exists(f"redislock:{{{name}}}:{PERMIT_HOLDERS[kind]}") == 0
    writer = _permit("write" if kind != "Semaphore" else kind, name, blocking=False)
    assert writer.acquire()  # nobody's permit is left in the way
    writer.release()


def test_an_interrupted_grant_gives_back_only_its_own_permit(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redislock import Semaphore

    first = Semaphore("own-permit", 2, timeout=60)
    assert first.acquire()
    second = Semaphore("own-permit", 2, timeout=60)
    real = type(second).acquire_script

    class GrantedThenInterrupted:
        def __getattr__(self, attr: str) -> Any:
            return getattr(real, attr)

        def __call__(self, *args: Any) -> Any:
            real(*args)
            raise KeyboardInterrupt

    monkeypatch.setattr(second, "acquire_script", GrantedThenInterrupted())
    with pytest.raises(KeyboardInterrupt):
        second.acquire()
    holders = redis_client.zrange("redislock:{own-permit}:semaphore", 0, -1)
    assert len(holders) == 1 and holders[0].startswith(first._latest().token.encode())
    first.release()


@pytest.mark.parametrize("kind", list(PERMIT_HOLDERS))
def test_a_cancelled_async_permit_acquire_after_the_grant_is_given_back(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from django_redislock import AsyncReadWriteLock, AsyncSemaphore
    from django_redislock.backend.scripts import RWLOCK_ACQUIRE, SEMAPHORE_ACQUIRE

    real_run = async_locks.AsyncConnection.run

    async def ran_then_cancelled(self: Any, script: Any, keys: Any, args: Any) -> Any:
        result = await real_run(self, script, keys, args)
        if script in (SEMAPHORE_ACQUIRE, RWLOCK_ACQUIRE):
            raise asyncio.CancelledError
        return result

    monkeypatch.setattr(
        "django_redislock.primitives.async_lock.AsyncConnection.run", ran_then_cancelled
    )
    name = f"async-granted-{kind}"

    async def main() -> None:
        if kind == "Semaphore":
            permit: Any = AsyncSemaphore(name, 1, timeout=60)
        else:
            rwlock = AsyncReadWriteLock(name, timeout=60)
            permit = rwlock.write() if kind == "write" else rwlock.read()
        with pytest.raises(asyncio.CancelledError):
            await permit.acquire()

    asyncio.run(main())
    monkeypatch.undo()
    assert redis_client.exists(f"redislock:{{{name}}}:{PERMIT_HOLDERS[kind]}") == 0
