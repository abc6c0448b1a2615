"""A lane's waiting renewals go in one pipeline, each reply read for its own holding."""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import Lock, LockBackendError, LockLostError, LockNotOwnedError, Semaphore
from django_redislock import signals as lock_signals
from django_redislock.backend.scripts import PERMIT_RENEW
from django_redislock.holds.holding import Holding
from django_redislock.holds.renewals import BATCHED, MAX_BATCH, renew_all, take_batch
from tests.support.renewals import RENEWAL_THREAD, hold_back_renewals


@contextmanager
def calls(thread: str | None = None) -> Iterator[list[tuple[str, int]]]:
    """Each command ``thread`` (by name; this one's by default) sends through
    ``Redis.execute_command`` while the block runs, as a tracer sees it: its
    name and, for ``EVALSHA``, how many keys it carries (else 0)."""
    seen: list[tuple[str, int]] = []
    execute = redis.Redis.execute_command
    name = thread or threading.current_thread().name

    def traced(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if threading.current_thread().name == name:
            command = str(args[0]).lower()
            seen.append((command, int(args[2]) if command == "evalsha" else 0))
        return execute(self, *args, **options)

    redis.Redis.execute_command = traced  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        redis.Redis.execute_command = execute  # type: ignore[method-assign]


def held(count: int, prefix: str, *, timeout: float = 30.0) -> list[Lock]:
    """``count`` locks held without the watchdog (the tests renew them), their
    extend script loaded."""
    locks = [Lock(f"{prefix}:{i}", timeout=timeout, auto_renew=False) for i in range(count)]
    for lock in locks:
        assert lock.acquire()
    holding = holding_of(locks[0])
    holding.renew_script.ensure_loaded(holding.client)
    BATCHED[holding.renew_script.sha].ensure_loaded(holding.client)
    return locks


def holding_of(lock: Lock) -> Holding:
    holding = lock._holding()
    assert holding is not None
    return holding


def renewed(locks: list[Lock], lease: float = 30.0) -> list[tuple[Lock, Any]]:
    """Renew ``locks`` with ``lease`` (in one batch); each lock with its outcome."""
    holdings = [holding_of(lock) for lock in locks]
    for holding in holdings:
        holding.lease = lease
    results = list(renew_all([weakref.ref(holding) for holding in holdings]))
    by_holding = {id(holding): outcome for holding, _, outcome in results}
    return [(lock, by_holding[id(holdings[i])]) for i, lock in enumerate(locks)]


def release_all(locks: list[Lock]) -> None:
    """Release what is still held; a lost lease or a lock never taken is left."""
    for lock in locks:
        with suppress(LockLostError, LockNotOwnedError):
            lock.release()


def test_renewals_of_one_client_go_in_one_script_call(redis_client: redis.Redis) -> None:
    locks = held(20, "batch:one")
    try:
        with calls() as seen:
            results = renewed(locks, lease=50.0)
        assert [outcome for _, outcome in results] == [True] * 20
        assert seen == [("evalsha", 20)]  # one call, every key
        for lock in locks:
            assert 40_000 < redis_client.pttl(holding_of(lock).renew_keys[0]) <= 50_000
            assert holding_of(lock).lease_deadline > time.monotonic() + 45
    finally:
        release_all(locks)


def test_leases_of_different_lengths_go_in_one_call_each(redis_client: redis.Redis) -> None:
    locks = held(6, "batch:leases")
    try:
        holding_of(locks[0]).lease = 40.0
        holding_of(locks[3]).lease = 40.0
        with calls() as seen:
            results = list(renew_all([weakref.ref(holding_of(lock)) for lock in locks]))
        assert [outcome for _, _, outcome in results] == [True] * 6
        assert sorted(seen) == [("evalsha", 2), ("evalsha", 4)]
        assert redis_client.pttl(holding_of(locks[0]).renew_keys[0]) > 35_000
        assert redis_client.pttl(holding_of(locks[1]).renew_keys[0]) <= 30_000
    finally:
        release_all(locks)


def test_a_lease_gone_is_lost_and_the_others_renew(redis_client: redis.Redis) -> None:
    locks = held(5, "batch:gone")
    try:
        redis_client.delete(holding_of(locks[2]).renew_keys[0])
        redis_client.set(holding_of(locks[3]).renew_keys[0], "another:0:1:1:30000:0:holder")
        with calls() as seen:
            results = renewed(locks, lease=50.0)
        assert [outcome for _, outcome in results] == [True, True, False, False, True]
        assert seen == [("evalsha", 5)]
        assert redis_client.pttl(holding_of(locks[3]).renew_keys[0]) == -1  # left as it was
        assert redis_client.pttl(holding_of(locks[4]).renew_keys[0]) > 40_000
    finally:
        release_all(locks)


def test_a_lease_gone_while_releasing_is_no_loss(redis_client: redis.Redis) -> None:
    """Not ours because a release on its way ran first: the release decides."""
    locks = held(3, "batch:releasing")
    try:
        holding_of(locks[0]).releasing = True
        redis_client.delete(holding_of(locks[0]).renew_keys[0])
        assert [outcome for _, outcome in renewed(locks)] == [True, True, True]
    finally:
        holding_of(locks[0]).releasing = False
        release_all(locks)


def test_an_error_reply_fails_only_its_own_renewal(redis_client: redis.Redis) -> None:
    locks = held(4, "batch:error")
    key = holding_of(locks[1]).renew_keys[0]
    try:
        redis_client.delete(key)
        redis_client.hset(key, "not", "a lock")  # the extend's GET answers WRONGTYPE
        with calls() as seen:
            results = renewed(locks, lease=50.0)
        outcomes = [outcome for _, outcome in results]
        assert outcomes[0] is True and outcomes[2] is True and outcomes[3] is True
        error = outcomes[1]
        assert isinstance(error, LockBackendError)
        assert error.name == "batch:error:1"
        assert isinstance(error.__cause__, redis.ResponseError)
        assert "WRONGTYPE" in str(error)
        assert seen == [("evalsha", 4)]
        assert redis_client.pttl(holding_of(locks[3]).renew_keys[0]) > 40_000  # after it
    finally:
        redis_client.delete(key)
        release_all(locks)


def test_a_holding_that_sends_its_lease_its_own_way_is_renewed_alone() -> None:
    class Own(Holding):
        __slots__ = ()

        def send_lease(self, lease: float) -> bool:
            return True

    lock = Lock("batch:own", auto_renew=False)
    assert lock.acquire()
    try:
        holding = holding_of(lock)
        assert holding.batch_client is not None
        holding.__class__ = Own
        assert holding.batch_client is None
    finally:
        holding.__class__ = Holding
        lock.release()


def test_a_failed_call_fails_each_renewal_with_its_own_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locks = held(3, "batch:down")
    execute = redis.Redis.execute_command

    def unreachable(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if str(args[0]).lower() == "evalsha":
            raise redis.ConnectionError("Connection refused")
        return execute(self, *args, **options)

    try:
        monkeypatch.setattr(redis.Redis, "execute_command", unreachable)
        results = renewed(locks)
        monkeypatch.undo()
        for lock, outcome in results:
            assert isinstance(outcome, LockBackendError)
            assert outcome.name == lock.name
            assert "unreachable" in str(outcome)
            assert isinstance(outcome.__cause__, redis.ConnectionError)
            assert holding_of(lock).renewing_lease is None
    finally:
        release_all(locks)


def test_a_flushed_script_is_loaded_and_the_batch_sent_again(redis_client: redis.Redis) -> None:
    """NOSCRIPT (a restart, ``SCRIPT FLUSH``): the script is loaded and the
    call sent again."""
    locks = held(6, "batch:noscript")
    try:
        renewed(locks)
        redis_client.script_flush()
        with calls() as seen:
            results = renewed(locks, lease=50.0)
        assert [outcome for _, outcome in results] == [True] * 6
        assert seen == [("evalsha", 6), ("script load", 0), ("evalsha", 6)]
        for lock in locks:
            assert redis_client.pttl(holding_of(lock).renew_keys[0]) > 40_000
    finally:
        release_all(locks)


def test_an_extend_crossing_the_batch_is_sent_again(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    """An ``extend()`` to another lease while the call is on its way: that
    renewal (only) sends the new lease once more, in one more call."""
    locks = held(3, "batch:crossed")
    crossing = holding_of(locks[1])
    execute = redis.Redis.execute_command
    sent: list[list[Any]] = []

    def extended_meanwhile(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if str(args[0]).lower() == "evalsha":
            sent.append(list(args[3:]))
            if len(sent) == 1:  # the extend is sent (elsewhere) while the call is out
                assert crossing.begin_extend(80.0, time.monotonic())
        return execute(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", extended_meanwhile)
    try:
        results = renewed(locks)
        assert [outcome for _, outcome in results] == [True] * 3
        assert len(sent) == 2
        assert len(sent[0]) == 2 * 3 + 1  # three keys, the lease, three tokens
        assert sent[1] == [crossing.renew_keys[0], 80_000, crossing.token]
        assert redis_client.pttl(crossing.renew_keys[0]) > 70_000
        assert crossing.lease_deadline > time.monotonic() + 70
        assert crossing.renewing_lease is None
    finally:
        release_all(locks)


def test_permits_are_batched_too(redis_client: redis.Redis) -> None:
    semaphores = [Semaphore(f"batch:permit:{i}", 2, timeout=30, auto_renew=False) for i in range(4)]
    semaphores.append(Semaphore("batch:permit:0", 2, timeout=30, auto_renew=False))
    for semaphore in semaphores:
        assert semaphore.acquire()
    try:
        holdings = [semaphore._latest() for semaphore in semaphores]
        assert all(holdings)
        redis_client.zrem(holdings[2].renew_keys[0], holdings[2].token)  # type: ignore[union-attr]
        PERMIT_RENEW.ensure_loaded(redis_client)
        with calls() as seen:
            results = list(renew_all([weakref.ref(h) for h in holdings if h is not None]))
        assert [outcome for _, _, outcome in results] == [True, True, False, True, True]
        assert seen == [("evalsha", 5)]  # two holders of one semaphore: one key twice
    finally:
        for semaphore in semaphores[:2] + semaphores[3:]:
            semaphore.release()


def test_a_lone_renewal_is_sent_alone() -> None:
    locks = held(1, "batch:alone")
    try:
        with calls() as seen:
            assert [outcome for _, outcome in renewed(locks)] == [True]
        assert seen == [("evalsha", 1)]  # the extend script, as extend() sends it
    finally:
        release_all(locks)


def test_a_lane_takes_a_run_of_one_kind_up_to_the_cap() -> None:
    def renew(refs: list[Any]) -> None: ...
    def overdue(refs: list[Any]) -> None: ...

    jobs: deque[tuple[Any, int]] = deque(
        [(renew, i) for i in range(MAX_BATCH + 10)] + [(overdue, -1), (renew, -2)]
    )
    assert take_batch(jobs) == (renew, list(range(MAX_BATCH)))
    assert take_batch(jobs) == (renew, list(range(MAX_BATCH, MAX_BATCH + 10)))
    assert take_batch(jobs) == (overdue, [-1])
    assert take_batch(jobs) == (renew, [-2])
    assert not jobs


# through the watchdog ---------------------------------------------------------------


@contextmanager
def lane_held_up(monkeypatch: pytest.MonkeyPatch, gate_name: str) -> Iterator[threading.Event]:
    """Hold the lane up on the renewal of ``gate_name`` (a lock the test takes
    first) until the event is set: the renewals due meanwhile wait in its queue."""
    release = threading.Event()
    hold_back_renewals(monkeypatch, gate_name, lambda holding, lease: release.wait(5))
    try:
        yield release
    finally:
        release.set()


@contextmanager
def losses() -> Iterator[list[str]]:
    lost: list[str] = []

    def on_lost(name: str, **kwargs: Any) -> None:
        lost.append(name)

    lock_signals.lock_lost.connect(on_lost)
    try:
        yield lost
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


def test_the_watchdog_renews_the_leases_waiting_in_a_lane_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane sent one round trip per renewal: a process holding about 2,000
    leases of a second could not keep up, and leases lapsed. Here the lane is
    held up by one renewal while the others get due; they then go together."""
    gate = Lock("batch:gate", timeout=2.0)
    locks = [Lock(f"batch:lane:{i}", timeout=2.0) for i in range(30)]
    with lane_held_up(monkeypatch, gate.name) as release, losses() as lost:
        try:
            with calls(RENEWAL_THREAD) as seen:
                assert gate.acquire()
                time.sleep(0.2)  # the others get due while the gate's renewal waits
                for lock in locks:
                    assert lock.acquire()
                time.sleep(1.0)
                release.set()
                time.sleep(0.5)
            assert max(keys for _, keys in seen) >= 25, seen  # (nearly) all in one
            assert {command for command, _ in seen} == {"evalsha"}
            assert lost == []
            assert all(lock.owned() for lock in [gate, *locks])
        finally:
            release_all([gate, *locks])


def test_a_call_carries_at_most_renewal_batch_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Lock("batch:gate", timeout=2.0)
    locks = [Lock(f"batch:capped:{i}", timeout=2.0) for i in range(10)]
    with (
        override_settings(REDISLOCK={"RENEWAL_BATCH": 4}),
        lane_held_up(monkeypatch, gate.name) as release,
        losses() as lost,
    ):
        try:
            with calls(RENEWAL_THREAD) as seen:
                assert gate.acquire()
                time.sleep(0.2)  # the others get due while the gate's renewal waits
                for lock in locks:
                    assert lock.acquire()
                time.sleep(1.0)
                release.set()
                time.sleep(0.5)
            batches = [keys for command, keys in seen if command == "evalsha"]
            assert max(batches) == 4, seen
            assert lost == []
        finally:
            release_all([gate, *locks])


def test_one_lease_gone_in_a_batch_is_told_and_the_others_kept(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    gate = Lock("batch:gate", timeout=2.0)
    locks = [Lock(f"batch:some:{i}", timeout=2.0) for i in range(10)]
    with lane_held_up(monkeypatch, gate.name) as release, losses() as lost:
        try:
            with calls(RENEWAL_THREAD) as seen:
                assert gate.acquire()
                time.sleep(0.2)
                for lock in locks:
                    assert lock.acquire()
                redis_client.delete(holding_of(locks[4]).renew_keys[0])
                time.sleep(1.0)
                release.set()
                time.sleep(0.5)
            assert max(keys for _, keys in seen) >= 8, seen
            assert lost == ["batch:some:4"]
            assert [lock.owned() for lock in locks] == [i != 4 for i in range(10)]
            with pytest.raises(LockLostError):
                locks[4].release()
        finally:
            release_all([gate, *locks])
