"""The watchdog's lanes: a server that hangs delays only the renewals of the
leases held on it, and a renewal that never comes back is reported at the
lease end, with or without a socket timeout."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_redislock import Lock, LockLostError, Semaphore
from django_redislock import signals as lock_signals
from django_redislock.holds import lanes as lanes_module
from django_redislock.holds import watchdog as watchdog_module
from tests.engine.test_hung_server import Pausable
from tests.holds.test_counters import counters_of
from tests.holds.test_watchdog import _Renewable
from tests.settings import redis_cache
from tests.support.renewals import RENEWAL_THREAD
from tests.support.scaleout import RedisClusterNodes, cluster_cache, wait_until
from tests.support.threads import refuse_threads, wait_idle
from tests.test_cluster import lock_key, primary_for


@pytest.fixture
def dog(monkeypatch: pytest.MonkeyPatch) -> Iterator[watchdog_module.Watchdog]:
    """A watchdog of the test's own, whose threads are gone after the test
    (tests elsewhere count the process's watchdog threads)."""
    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.2)
    dog = watchdog_module.Watchdog()
    yield dog
    wait_idle(dog)
    wait_until(
        lambda: not dog.lanes._lanes and dog._thread is None, "the watchdog's threads to exit"
    )


class GoneAndExits(_Renewable):
    """A hold whose renewal finds the lease gone, reported to a ``lock_lost``
    receiver that calls ``sys.exit()``."""

    def renew(self) -> bool:
        super().renew()
        return False

    def mark_lost(self, reason: str) -> None:
        super().mark_lost(reason)
        raise SystemExit


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == RENEWAL_THREAD]


def test_a_renewal_stuck_on_one_server_delays_no_lease_held_elsewhere(
    dog: watchdog_module.Watchdog,
) -> None:
    """One thread renewing in turn waited on the stuck call (up to the socket
    timeout) before it renewed anything else."""
    gate = threading.Event()  # never set while the test looks: the server hangs
    stuck = _Renewable(gate, lane="hung", hold=30)
    elsewhere = _Renewable(lane="healthy", enough=3)
    dog.watch(stuck)
    assert stuck.renewing.wait(5)
    dog.watch(elsewhere)
    try:
        assert elsewhere.renewed.wait(5), "the other server's lease waited on the hung one"
        assert stuck.renewals == 1 and not stuck.lost
    finally:
        gate.set()
        dog.unwatch(stuck)
        dog.unwatch(elsewhere)


def test_renewals_on_one_server_still_go_one_at_a_time(dog: watchdog_module.Watchdog) -> None:
    """A lane is one connection's worth of renewals, as the single thread was:
    a second lease on the same server waits for the first one's renewal."""
    gate = threading.Event()
    first = _Renewable(gate, lane="same", hold=30)
    second = _Renewable(lane="same")
    dog.watch(first)
    assert first.renewing.wait(5)
    dog.watch(second)
    try:
        assert not second.renewing.wait(0.3)  # the subject is a wait that does not end
        gate.set()
        assert second.renewing.wait(5)
    finally:
        gate.set()
        dog.unwatch(first)
        dog.unwatch(second)


def test_a_renewal_that_never_returns_is_reported_at_the_lease_end(
    dog: watchdog_module.Watchdog,
) -> None:
    """No socket timeout, a server that hangs: the renewal never fails, so
    only its lease end can tell the holder, from outside its stuck lane."""
    gate = threading.Event()
    stuck = _Renewable(gate, lane="hung", lease=0.6, hold=30)
    watched = time.monotonic()
    dog.watch(stuck)
    try:
        assert stuck.told.wait(10), "a renewal stuck past the lease end was never reported"
        told_at, reason = stuck.lost[0]
        assert stuck.lease_deadline <= told_at < watched + 0.6 + 2.0
        assert reason == "no answer to the renewal before the lease ended"
        assert dog.watching() == 0  # never renewed again
        assert stuck.renewals == 1
    finally:
        gate.set()


def test_a_lane_that_cannot_start_renews_from_the_scheduler(
    dog: watchdog_module.Watchdog, monkeypatch: pytest.MonkeyPatch
) -> None:
    renewable = _Renewable(enough=2)
    dog.ensure_running()  # the scheduler starts; no thread after it can
    refused = refuse_threads(monkeypatch, watchdog_module, lanes_module)
    dog.watch(renewable)
    try:
        assert renewable.renewed.wait(5)
        assert refused and all(t.name == RENEWAL_THREAD for t in refused)
        assert not renewable.lost
    finally:
        dog.unwatch(renewable)


def test_lanes_leave_once_idle(dog: watchdog_module.Watchdog) -> None:
    before = len(lane_threads())
    renewables = [_Renewable(lane=f"server-{i}") for i in range(3)]
    for renewable in renewables:
        dog.watch(renewable)
    for renewable in renewables:
        assert renewable.renewed.wait(5)
        dog.unwatch(renewable)
    wait_until(lambda: not dog.lanes._lanes, "the idle lanes to exit")
    assert len(lane_threads()) <= before


def test_a_lane_killed_by_a_receiver_is_replaced(dog: watchdog_module.Watchdog) -> None:
    """``SystemExit`` from a ``lock_lost`` receiver ends a lane's thread; the
    lane stayed registered, and every later renewal on its server waited in a
    queue nobody served."""

    gate = threading.Event()
    gone = GoneAndExits(gate, hold=30)
    behind = _Renewable(lane=gone.lane, enough=2)  # waits in the lane behind it
    dog.watch(gone)
    assert gone.renewing.wait(5)
    dog.watch(behind)
    try:
        gate.set()
        assert gone.told.wait(5)
        assert behind.renewed.wait(5), "no renewal after the lane's thread exited"
    finally:
        dog.unwatch(behind)


# against real servers, one of them frozen ------------------------------------------


@pytest.fixture
def hung_alias(redis_server_factory: Any) -> Iterator[Pausable]:
    """Alias ``hung``: a private server with no socket timeout, to freeze."""
    server = Pausable(redis_server_factory())
    caches = {
        **settings.CACHES,
        "hung": redis_cache(server.server.url, SOCKET_TIMEOUT=None, SOCKET_CONNECT_TIMEOUT=None),
    }
    try:
        with override_settings(CACHES=caches):
            yield server
    finally:
        server.resume()
        server.client.close()


@pytest.mark.faults
@pytest.mark.usefixtures("real_redis")
@pytest.mark.parametrize("make", [Lock, lambda name, **kw: Semaphore(name, 2, **kw)],
                         ids=["Lock", "Semaphore"])  # fmt: skip
def test_a_frozen_server_takes_only_its_own_leases(hung_alias: Pausable, make: Any) -> None:
    """The leases on the healthy server outlive the frozen one's by far, and
    the frozen one's holder is told at its lease end, with no socket timeout
    to end the stuck renewal."""
    lost: list[tuple[str, float]] = []
    told = threading.Event()

    def on_lost(name: str, **kwargs: Any) -> None:
        lost.append((name, time.monotonic()))
        told.set()

    healthy = make("lanes:healthy", timeout=0.6)
    frozen = make("lanes:frozen", timeout=1.0, using="hung")
    lock_signals.lock_lost.connect(on_lost)
    try:
        assert healthy.acquire() and frozen.acquire()
        acquired = time.monotonic()
        hung_alias.pause()
        assert told.wait(10), "the frozen server's holder was never told"
        assert [name for name, _ in lost] == ["lanes:frozen"]
        assert lost[0][1] < acquired + 1.0 + 2.0
        # four of the healthy lease's lifetimes so far; it is renewed, not lost
        deadline = acquired + 2.4
        while time.monotonic() < deadline:
            time.sleep(0.1)  # the subject is leases that must outlast this wait
            assert healthy.owned()
        assert [name for name, _ in lost] == ["lanes:frozen"]
        healthy.release()
        hung_alias.resume()
        with pytest.raises(LockLostError):
            frozen.release()
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
        hung_alias.resume()


@pytest.mark.faults
@pytest.mark.usefixtures("real_redis")
@pytest.mark.parametrize("socket_timeout", [None, 0.5], ids=["no-socket-timeout", "0.5s"])
def test_every_frozen_hold_on_one_server_is_told_at_its_lease_end(
    redis_server_factory: Any, socket_timeout: float | None
) -> None:
    """Their reports go one after another: the first one's count of the loss,
    a round trip to the frozen server, held up the others (for good without a
    socket timeout, 0.5 s each with one)."""
    server = Pausable(redis_server_factory())
    options = {"SOCKET_TIMEOUT": socket_timeout, "SOCKET_CONNECT_TIMEOUT": socket_timeout}
    caches = {**settings.CACHES, "hung": redis_cache(server.server.url, **options)}
    told: dict[str, float] = {}
    every = threading.Event()
    with override_settings(CACHES=caches):  # an alias is checked when a lock is built
        locks = [Lock(f"lanes:frozen:{i}", timeout=1.2, using="hung") for i in range(4)]

    def on_lost(name: str, **kwargs: Any) -> None:
        told[name] = time.monotonic()
        if len(told) == len(locks):
            every.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with override_settings(CACHES=caches):
            for lock in locks:
                assert lock.acquire()
            acquired = time.monotonic()
            server.pause()
            assert every.wait(10), f"told only {sorted(told)}"
            late = max(told.values()) - (acquired + 1.2)
            assert late < 1.0, f"the last one was told {late:.2f} s after its lease end"
            server.resume()
            for lock in locks:
                with pytest.raises(LockLostError):
                    lock.release()
            assert counters_of(server.client, "lanes:frozen:0")["lost"] == 1
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
        server.resume()
        server.client.close()


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterNodes]:
    """A cluster of the test's own (no socket timeout), to freeze a node of."""
    nodes = RedisClusterNodes().start()
    try:
        with override_settings(CACHES={**settings.CACHES, "cl": cluster_cache(nodes.urls)}):
            yield nodes
    finally:
        nodes.stop()


def name_on(cluster: RedisClusterNodes, node: int, prefix: str) -> str:
    """A lock name whose slot ``node`` serves."""
    names = (f"{prefix}:{i}" for i in range(1000))
    return next(name for name in names if primary_for(cluster, lock_key(name)) == node)


@pytest.mark.scaleout
def test_a_frozen_cluster_node_takes_only_its_own_leases(own_cluster: RedisClusterNodes) -> None:
    """A cluster client has no one connection pool: each node is a lane of
    its own (all the nodes shared one, so one frozen node cost every lease)."""
    lost: list[str] = []
    told = threading.Event()

    def on_lost(name: str, **kwargs: Any) -> None:
        lost.append(name)
        told.set()

    frozen_name = name_on(own_cluster, 0, "cl-frozen")
    healthy_name = name_on(own_cluster, 1, "cl-healthy")
    healthy = Lock(healthy_name, timeout=0.6, using="cl")
    frozen = Lock(frozen_name, timeout=1.0, using="cl")
    node = own_cluster.servers[0].process
    assert node is not None
    lock_signals.lock_lost.connect(on_lost)
    try:
        assert healthy.acquire() and frozen.acquire()
        healthy.extend()  # the extend script is loaded on every node before the freeze
        acquired = time.monotonic()
        node.send_signal(signal.SIGSTOP)
        try:
            assert told.wait(10)
            while time.monotonic() < acquired + 2.4:
                time.sleep(0.1)  # the subject is leases that must outlast this wait
                assert healthy.owned()
        finally:
            node.send_signal(signal.SIGCONT)
        assert lost == [frozen_name]
        healthy.release()
        with pytest.raises(LockLostError):
            frozen.release()
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


def test_systemexit_in_the_scheduler_itself_leaves_it_running(
    dog: watchdog_module.Watchdog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No lane can start, so the scheduler runs the jobs: ``SystemExit`` from
    a ``lock_lost`` receiver there killed it while it stayed registered, and
    nothing in the process was renewed or reported again."""

    dog.ensure_running()  # the scheduler starts; no lane can
    refuse_threads(monkeypatch, watchdog_module, lanes_module)
    gone = GoneAndExits()
    dog.watch(gone)
    assert gone.told.wait(5)
    later = _Renewable()
    dog.watch(later)
    try:
        assert later.renewed.wait(5), "nothing renews any more"
    finally:
        dog.unwatch(later)


@pytest.mark.usefixtures("real_redis")
def test_an_extend_answered_after_the_loss_was_reported_raises(
    monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    """The renewal reached Redis, its reply never came back, and the holder's
    ``extend()``, on its way on another connection, outlasted the lease: the
    loss was reported first, so the extend must not return as a success (the
    watchdog has let the hold go: its new lease would run out unrenewed)."""
    from django_redislock.holds.holding import Holding

    name = "lanes:extend-after-loss"
    in_flight, told, reply = threading.Event(), threading.Event(), threading.Event()
    send_lease, begin_extend = Holding.send_lease, Holding.begin_extend

    def reply_never_comes(self: Holding, lease: float) -> bool:
        ours = send_lease(self, lease)  # Redis renewed the lease, but the reply is stuck
        if threading.current_thread().name == RENEWAL_THREAD and self.name == name:
            in_flight.set()
            reply.wait(10)
        return ours

    def slow_extend(self: Holding, lease: float, started: float) -> bool:
        overlapped = begin_extend(self, lease, started)
        if self.name == name:
            told.wait(5)  # the extend's round trip outlasts the holder's lease
        return overlapped

    monkeypatch.setattr("django_redislock.holds.holding.Holding.send_lease", reply_never_comes)
    monkeypatch.setattr("django_redislock.holds.holding.Holding.begin_extend", slow_extend)

    def on_lost(name: str, **kwargs: Any) -> None:
        if name == "lanes:extend-after-loss":
            told.set()

    lock_signals.lock_lost.connect(on_lost)
    lock = Lock(name, timeout=1.0)
    try:
        assert lock.acquire()
        assert in_flight.wait(5)
        with pytest.raises(LockLostError, match="no answer to the renewal"):
            lock.extend(5.0)
        assert told.is_set()
    finally:
        reply.set()
        lock_signals.lock_lost.disconnect(on_lost)
        with pytest.raises(LockLostError):
            lock.release()
