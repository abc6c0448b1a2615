from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from django_redislock import (
    AsyncLock,
    AsyncSemaphore,
    Lock,
    LockBackendError,
    LockError,
    LockLostError,
    MultiLock,
    ReadWriteLock,
    Semaphore,
)
from django_redislock import signals as lock_signals
from django_redislock.holds import settling
from django_redislock.holds import watchdog as watchdog_module
from django_redislock.holds.watchdog import watchdog
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread
from tests.support.renewals import THREAD_NAME, hold_back_renewals
from tests.support.servers import RedisServer
from tests.support.signals_helper import capture
from tests.support.threads import no_watchdog_thread, wait_idle


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_one_thread_for_many_locks_and_threads() -> None:
    locks = [Lock(f"many:{i}", timeout=5) for i in range(20)]
    for lock in locks:
        assert lock.acquire()
    inner: list[bool] = []

    def hold_more() -> None:
        with Lock("many:thread", timeout=5):
            inner.append(len(watchdog_threads()) == 1)

    thread = threading.Thread(target=hold_more)
    thread.start()
    thread.join(10)
    assert inner == [True]
    assert len(watchdog_threads()) == 1
    for lock in locks:
        lock.release()
    assert len(watchdog_threads()) <= 1


def test_thread_exits_after_idle_and_restarts_on_demand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    with Lock("idle", timeout=5):
        pass
    thread = watchdog._thread
    if thread is not None:  # may already have exited
        thread.join(10)
        assert not thread.is_alive()
    assert watchdog_threads() == []
    with Lock("idle", timeout=5) as lock:
        assert len(watchdog_threads()) == 1
        assert lock.owned()


def test_the_idle_countdown_starts_at_the_last_release_not_at_its_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler waits for the next renewal due; a release that leaves it
    nothing to renew wakes it, so it ends ``IDLE_EXIT`` after the release,
    not after the renewal a long lease would have had (here, 20 s away)."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.3)
    lock = Lock("idle-after-release", timeout=60)
    assert lock.acquire()
    assert watchdog.watching() == 1  # scheduled, not just queued
    thread = watchdog._thread
    assert thread is not None
    with watchdog._cond:
        watchdog._cond.notify_all()  # it waits for the renewal due now
    deadline = time.monotonic() + 10
    while watchdog._wake_at < time.monotonic() + 10:
        assert time.monotonic() < deadline, "the scheduler never waited for the renewal"
        time.sleep(0.01)
    lock.release()
    thread.join(5)
    assert not thread.is_alive(), "the watchdog slept on towards a released hold's renewal"


def test_no_thread_without_auto_renew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    wait_idle()
    with Lock("manual", timeout=5, auto_renew=False):
        assert watchdog_threads() == []


def test_renewal_keeps_many_short_leases_alive() -> None:
    locks = [Lock(f"short:{i}", timeout=0.6) for i in range(5)]
    for lock in locks:
        lock.acquire()
    time.sleep(2.0)  # more than three leases
    assert all(lock.owned() for lock in locks)
    for lock in locks:
        lock.release()


def test_lock_lost_fires_when_redis_dies_mid_hold(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    lease = 1.5
    cache = redis_cache(server.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5)
    lost = threading.Event()

    def on_lost(**kwargs: object) -> None:
        if kwargs["name"] == "doomed":
            lost.set()

    with override_settings(CACHES={"default": cache}), capture(lock_signals.lock_lost) as calls:
        lock_signals.lock_lost.connect(on_lost)
        try:
            with pytest.raises(LockError) as info:
                with Lock("doomed", timeout=lease):
                    server.kill()
                    killed = time.monotonic()
                    assert lost.wait(lease + 10), "lock_lost never fired"
                    noticed = time.monotonic() - killed
        finally:
            lock_signals.lock_lost.disconnect(on_lost)
    # told by the end of the lease (plus a renewal attempt's socket timeout)
    assert noticed < lease + 2
    assert [c["name"] for c in calls] == ["doomed"]
    assert "could not reach Redis" in str(calls[0]["reason"])
    # leaving the block cannot talk to Redis either: a LockError, never a redis-py one
    assert isinstance(info.value, LockError)


def test_lock_lost_from_the_watchdog_then_lock_lost_error_on_exit(redis_client: object) -> None:
    import redis

    assert isinstance(redis_client, redis.Redis)
    lost = threading.Event()

    def on_lost(**kwargs: object) -> None:
        lost.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLostError, match="watchdog"):
            with Lock("stolen", timeout=0.3):
                redis_client.delete("redislock:{stolen}:lock")
                assert lost.wait(5)
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


def test_a_renewal_that_keeps_raising_another_error_is_reported_before_the_lease_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py's ``RedisClusterException`` (a cluster it cannot reach) is no
    ``RedisError``: the watchdog took it for a bug and retried every 0.2 s
    with no look at the lease, so the holder was told only once a retry
    happened to be on its way after its lease end (as "no answer"), when
    another holder may already have the lock."""
    from redis.exceptions import RedisClusterException

    from django_redislock.holds.holding import Holding

    def unreachable(self: Holding, lease: float) -> bool:
        raise RedisClusterException("Redis Cluster cannot be connected")

    lost = threading.Event()
    told: list[float] = []

    def on_lost(**kwargs: object) -> None:
        if kwargs["name"] == "cut-off":
            told.append(time.monotonic())
            lost.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with capture(lock_signals.lock_lost) as calls, pytest.raises(LockLostError):
            with Lock("cut-off", timeout=1.0) as lock:
                holding = lock._holding()
                assert holding is not None
                monkeypatch.setattr(
                    "django_redislock.holds.holding.Holding.send_lease", unreachable
                )
                assert lost.wait(10), "lock_lost never fired"
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
    # no renewal went through, so this is the end of the lease it was granted
    assert told[0] < holding.lease_deadline
    [call] = calls
    assert "RedisClusterException" in str(call["reason"])


def test_a_renewal_that_crashed_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Renewals are settled after the batch, outside the ``except`` that
    caught their error: ``logger.exception`` there logged "NoneType: None"."""

    class Holding:
        lease_deadline = time.monotonic() + 60

    try:
        raise RuntimeError("a wrapper's own error")
    except RuntimeError as exc:
        error = exc
    watchdog.settling._failed(Holding(), time.monotonic(), error)  # type: ignore[arg-type]
    [record] = [r for r in caplog.records if r.getMessage().startswith("Lease renewal crashed")]
    assert record.exc_info is not None and record.exc_info[1] is error


# extend(): the new lease is the one the watchdog renews, on every primitive


def _factories() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """Per primitive: a holder's handle, and a handle another holder contends with."""
    return {
        "lock": (lambda **kw: Lock("ext", **kw), lambda: Lock("ext")),
        "semaphore": (lambda **kw: Semaphore("ext", 1, **kw), lambda: Semaphore("ext", 1)),
        "read": (
            lambda **kw: ReadWriteLock("ext", **kw).read(),
            lambda: ReadWriteLock("ext").write(),
        ),
        "write": (
            lambda **kw: ReadWriteLock("ext", **kw).write(),
            lambda: ReadWriteLock("ext").read(),
        ),
        "multilock": (
            lambda **kw: MultiLock(["ext", "ext:2"], **kw),
            lambda: MultiLock(["ext:2", "ext"]),
        ),
    }


KINDS = list(_factories())


def lease_left(primitive: Any) -> float:
    if isinstance(primitive, MultiLock):
        left = [lock.ttl() for lock in primitive.locks]
    elif isinstance(primitive, Lock):
        left = [primitive.ttl()]
    else:
        left = [info.ttl for info in primitive.holders()]
    assert left and all(t is not None for t in left), f"{primitive!r} is not held"
    return min(t for t in left if t is not None)


@pytest.mark.parametrize("kind", KINDS)
def test_a_shorter_extend_is_the_lease_the_watchdog_renews(
    kind: str, other_thread: OtherThread
) -> None:
    make, rival = _factories()[kind]
    primitive = make(timeout=6)
    with primitive:
        # a lease of 1.2 s, renewed every 0.4 s (0.6 s was too short for a slow VM)
        primitive.extend(1.2)
        deadline = time.monotonic() + 2.5  # past the old schedule's first renewal (2 s)
        while time.monotonic() < deadline:
            assert primitive.owned()
            assert lease_left(primitive) <= 1.2
            time.sleep(0.05)
        assert other_thread(rival().acquire, blocking=False) is False
        assert primitive.owned()


@pytest.mark.parametrize("kind", KINDS)
def test_a_longer_extend_is_not_cut_back_by_renewals(kind: str) -> None:
    make, _ = _factories()[kind]
    primitive = make(timeout=0.3)
    with primitive:
        primitive.extend(60)
        time.sleep(1.0)  # ten renewal periods of the original lease
        assert lease_left(primitive) > 50


@pytest.mark.parametrize("kind", KINDS)
def test_extend_below_a_millisecond_is_a_value_error(kind: str) -> None:
    make, _ = _factories()[kind]
    primitive = make(timeout=5, auto_renew=False)
    with pytest.raises(ValueError, match="seconds"):
        primitive.extend(0.0005)  # checked before anything else, held or not
    with primitive:
        for bad in (0.0005, 0, -1.0):
            with pytest.raises(ValueError, match="seconds"):
                primitive.extend(bad)
        assert primitive.owned()
        assert lease_left(primitive) > 4


def test_async_primitives_follow_extend_too(other_thread: OtherThread) -> None:
    async def main() -> None:
        for make, rival in (
            (lambda: AsyncLock("aext", timeout=3), lambda: Lock("aext")),
            (lambda: AsyncSemaphore("aext", 1, timeout=3), lambda: Semaphore("aext", 1)),
        ):
            primitive = make()
            async with primitive:
                with pytest.raises(ValueError, match="seconds"):
                    await primitive.extend(0.0005)
                await primitive.extend(0.6)
                await asyncio.sleep(1.5)
                assert await primitive.owned()
                assert other_thread(rival().acquire, blocking=False) is False

    asyncio.run(main())


def test_a_nested_acquire_keeps_the_extended_lease(redis_client: Any) -> None:
    with Lock("nest-ext", timeout=30) as lock:
        lock.extend(120)
        with Lock("nest-ext", timeout=5):  # re-enters; never shortens the lease
            ttl = lock.ttl()
            assert ttl is not None and ttl > 100


class _Renewable:
    """A holding stand-in, due at once and again after each renewal, with a
    minute's lease; its renewal waits for ``gate`` if given (up to ``hold``
    seconds). ``renewed`` is set after ``enough`` renewals. Renewed alone
    (no ``batch_client``), as the watchdog renews a ``Redlock``'s."""

    renew_interval = 0.0
    batch_client = None
    active = True
    watch_state = 0  # the watchdog's (Holding.watch_state)
    hooks = None  # no loss hooks (Holding.hooks)

    def __init__(
        self,
        gate: threading.Event | None = None,
        *,
        lane: str = "server",
        lease: float = 60.0,
        hold: float = 5.0,
        enough: int = 1,
    ) -> None:
        self.lease_deadline = time.monotonic() + lease
        self.gate = gate
        self.lane = lane
        self.hold = hold
        self.enough = enough
        self.renewing = threading.Event()
        self.renewed = threading.Event()
        self.renewals = 0
        self.lost: list[tuple[float, str]] = []
        self.told = threading.Event()

    def renew(self) -> bool:
        self.renewals += 1
        self.renewing.set()
        ours = self.gate is None or self.gate.wait(self.hold)
        if self.renewals >= self.enough:
            self.renewed.set()
        return ours

    def mark_lost(self, reason: str) -> None:
        self.lost.append((time.monotonic(), reason))
        self.told.set()


def test_a_renewal_due_soon_after_another_goes_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Due within a tenth of its interval (at most a quarter of the retry
    delay) of one due now, it goes in the same pass, so the same round trip:
    a pass per renewal looked at every lease each time, and with thousands
    of short leases the scheduler fell behind."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    dog = watchdog_module.Watchdog()
    passes: list[int] = []
    renew_all = settling.renew_all

    def counted(refs: list[Any]) -> Any:
        passes.append(len(refs))
        return renew_all(refs)

    monkeypatch.setattr("django_redislock.holds.settling.renew_all", counted)
    first, soon = _Renewable(), _Renewable()
    first.renew_interval = soon.renew_interval = 1.0  # due 1 s after it is watched
    dog.watch(first)
    time.sleep(0.02)  # the subject: due 20 ms later, within a tenth of 1 s and 50 ms
    dog.watch(soon)
    try:
        assert first.renewed.wait(5) and soon.renewed.wait(5)
        assert passes[0] == 2, passes
    finally:
        dog.unwatch(first)
        dog.unwatch(soon)


def test_a_failed_renewal_of_a_long_lease_is_retried_at_the_retry_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking renewals a little early must not take retries early: a tenth of
    an hour-long lease's interval is 2 minutes, far more than the retry delay,
    and a failing renewal was retried in a busy loop until its lease end."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    dog = watchdog_module.Watchdog()

    class Failing(_Renewable):
        def renew(self) -> bool:
            super().renew()
            self.renew_interval = 1200.0  # an hour-long lease's, from now on
            raise LockBackendError("Redis is unreachable for lock 'x'", name="x")

    failing = Failing(lease=3600.0)
    dog.watch(failing)
    try:
        time.sleep(1.0)  # the subject is how often it retries meanwhile
        assert 2 <= failing.renewals <= 1 / watchdog_module.RETRY_DELAY + 2
        assert not failing.lost
    finally:
        dog.unwatch(failing)


def test_a_hold_dropped_while_another_renews_is_not_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass renews its due holdings one at a time, each waiting on Redis: one
    dropped meanwhile must be freed, not renewed once more after the wait."""
    import weakref

    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.05)
    dog = watchdog_module.Watchdog()
    first_gate, second_gate = threading.Event(), threading.Event()
    gate = _Renewable(first_gate)  # holds the thread while the next two get due
    dog.watch(gate)
    assert gate.renewing.wait(5)
    slow, dropped = _Renewable(second_gate), _Renewable()
    dog.watch(slow)
    dog.watch(dropped)
    thread = dog._thread
    first_gate.set()  # the next pass finds both due: slow first, then dropped
    assert slow.renewing.wait(5)
    freed = threading.Event()
    ref = weakref.ref(dropped, lambda _: freed.set())
    del dropped
    assert freed.wait(5), "the pass keeps a dropped holding until it renews it"
    second_gate.set()
    for holding in (gate, slow):
        dog.unwatch(holding)
    with dog._cond:
        dog._cond.notify()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and ref() is None


@pytest.mark.parametrize(("first", "then"), [(3.0, 60.0), (4.5, 1.5)], ids=["longer", "shorter"])
def test_an_extend_crossing_a_renewal_is_the_lease_redis_keeps(
    first: float, then: float, monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    """A renewal that read the old lease and reaches Redis after an extend
    must not leave the old lease there: a longer extend would lapse early."""
    read, go = threading.Event(), threading.Event()

    def wait_for_the_extend(holding: Any, lease: float) -> None:
        if not go.is_set():
            read.set()  # this renewal has read its lease: send it after the extend
            go.wait(10)

    done, renewed = hold_back_renewals(monkeypatch, "crossed", wait_for_the_extend)
    try:
        with Lock("crossed", timeout=first) as lock:
            assert read.wait(10)
            lock.extend(then)
            go.set()
            assert renewed.wait(10)
            assert done[0] == 2  # sent again, by the new lease
            holding = lock._holding()
            assert holding is not None and holding.lease == then
            deadline = holding.lease_deadline
            ttl = redis_client.pttl("redislock:{crossed}:lock") / 1000
            after = time.monotonic()
            if then > first:
                assert ttl > then - 10, f"the old lease is back: {ttl} s"
            else:
                assert 0 < ttl <= then
            assert deadline <= after + ttl + 0.01  # never later than Redis's
    finally:
        go.set()


def test_an_extend_to_the_same_lease_crossing_a_renewal_costs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read, go = threading.Event(), threading.Event()

    def wait_for_the_extend(holding: Any, lease: float) -> None:
        if not go.is_set():
            read.set()
            go.wait(10)

    done, renewed = hold_back_renewals(monkeypatch, "crossed-same", wait_for_the_extend)
    try:
        with Lock("crossed-same", timeout=3) as lock:
            assert read.wait(10)
            lock.extend()  # the lease as it stands: whichever runs last is right
            go.set()
            assert renewed.wait(10)
            assert done[0] == 1
    finally:
        go.set()


def test_extends_crossing_every_send_give_the_thread_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder whose extends cross each of a renewal's sends must not keep the
    watchdog's one thread from everybody else's leases."""

    def an_extend_crosses(holding: Any, lease: float) -> None:
        holding.begin_extend(lease + 1, time.monotonic())

    done, renewed = hold_back_renewals(monkeypatch, "crossed-always", an_extend_crosses)
    with Lock("crossed-always", timeout=3):
        assert renewed.wait(10)
        assert done[0] == 2  # sent again once, then back to the other leases


# a thread that cannot start ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_an_acquire_that_no_thread_would_renew_fails_before_any_grant(
    kind: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One refused start used to leave the thread set but never running:
    every lease of the process went unrenewed, unannounced, for good."""
    make = (lambda: Lock("unrenewed", timeout=5)) if kind == "lock" else (
        lambda: Semaphore("unrenewed", limit=2, timeout=5))  # fmt: skip
    no_watchdog_thread(monkeypatch)
    with pytest.raises(LockError, match="could not start the thread that renews leases"):
        make().acquire()
    assert list(redis_client.scan_iter("redislock:{unrenewed}:*")) == []  # nothing granted
    monkeypatch.undo()
    primitive = make()
    assert primitive.acquire()  # a thread can start again: it does
    assert watchdog._thread is not None and watchdog._thread.is_alive()
    primitive.release()


def test_the_scheduler_goes_on_after_a_pass_that_raised() -> None:
    """A logging handler raised while the scheduler reported a dropped hold:
    its thread ended, still registered as running, so nothing started
    another, and every lease of the process lapsed unrenewed and untold."""
    import logging

    raised = threading.Event()

    class Failing(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not raised.is_set():
                raised.set()
                raise RuntimeError("log shipping is down")

    handler = Failing()
    reports = logging.getLogger("django_redislock.watchdog")
    reports.addHandler(handler)
    try:
        Lock("dropped", timeout=1.0).acquire()  # nobody keeps the handle: reported
        assert raised.wait(5), "the dropped hold was never reported"
        with capture(lock_signals.lock_lost) as lost, Lock("renewed", timeout=1.0) as lock:
            time.sleep(3.0)  # the subject: three leases, each renewed in time
            assert lock.owned()
        assert not lost
    finally:
        reports.removeHandler(handler)


def test_a_loss_is_told_when_logging_it_raises(redis_client: Any) -> None:
    """The WARNING came first: a logging handler that raised on it kept
    ``lock_lost`` from being sent at all."""
    import logging

    class Failing(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("log shipping is down")

    lost = threading.Event()

    def on_lost(**kwargs: object) -> None:
        if kwargs["name"] == "told":
            lost.set()

    handler = Failing()
    losses = logging.getLogger("django_redislock.holds.holding")
    losses.addHandler(handler)
    lock_signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLostError), Lock("told", timeout=0.6):
            redis_client.delete("redislock:{told}:lock")
            assert lost.wait(5), "lock_lost never fired"
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
        losses.removeHandler(handler)


def test_a_hold_the_restarted_thread_cannot_take_is_reported_lost_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread went idle between the acquire's check and the grant, and
    cannot start again: the holder is told, not left with a lapsing lease."""
    no_watchdog_thread(monkeypatch)
    reasons: list[str] = []

    class Held:
        lease_deadline = time.monotonic() + 30
        renew_interval = 10.0
        lane = "server"
        active = True
        watch_state = 0
        hooks = None

        def renew(self) -> bool:
            return True

        def mark_lost(self, reason: str) -> None:
            reasons.append(reason)

    held = Held()
    watchdog.watch(held)
    assert reasons and "could not start the thread that renews leases" in reasons[0]
    assert watchdog.watching() == 0


def test_holds_released_before_their_renewal_never_reach_the_schedule() -> None:
    """A new hold is queued without the watchdog's lock (``watch``) and one
    released before the scheduler looks is dropped when it does: a hot
    acquire/release loop neither wakes the scheduler nor grows its heap."""
    watchdog.ensure_running()
    deadline = time.monotonic() + 10
    while watchdog._wake_at == float("inf") and time.monotonic() < deadline:
        time.sleep(0.001)  # until the scheduler's first pass says when it looks next
    with watchdog._lock:
        heap_before = len(watchdog._schedule.heap)
    for _ in range(10 * watchdog_module.ADMIT_BATCH):
        with Lock("hot-loop"):
            pass
    assert len(watchdog._arrivals) < watchdog_module.ADMIT_BATCH
    with watchdog._lock:
        # scheduled, each would have left an item (640); one in ADMIT_BATCH is,
        # the hold of the acquire that admits the queue
        assert len(watchdog._schedule.heap) <= heap_before + 10 + 1
    with watchdog._lock:
        watchdog._admit()
        assert not watchdog._arrivals
        assert all(
            entry.ref() is None or not entry.ref().active for entry in watchdog._watched.values()
        )


def test_a_hold_taken_while_the_scheduler_sleeps_long_is_renewed_in_time() -> None:
    """The scheduler sleeps until the earliest renewal it knows of; a new
    hold due sooner wakes it, though it was only queued."""
    with Lock("long-lease", timeout=60):  # the scheduler now sleeps ~20 s
        with Lock("short-lease", timeout=0.5) as short:
            for _ in range(4):  # twice its lease: renewed, or lost
                time.sleep(0.25)  # the subject: time passing with the lease running
                assert short.owned()


def test_a_hold_queued_as_the_scheduler_goes_idle_is_still_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler leaves after ``IDLE_EXIT`` with nothing to renew; a hold
    queued just then must not be left to a thread that is leaving (it marks
    itself gone, then looks at the queue once more, and ``watch`` looks at
    the thread after queueing)."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.01)
    with capture(lock_signals.lock_lost) as lost:
        for i in range(8):
            if i % 2:
                wait_idle()
            with Lock(f"idle-race:{i}", timeout=0.5) as lock:
                time.sleep(0.7)  # past the lease: only renewals keep it
                assert lock.owned()
    assert not lost
