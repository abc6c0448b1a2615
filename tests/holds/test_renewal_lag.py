"""A watchdog past its capacity says so before it loses leases, and losses
by the thousand are logged in a line per interval, each holder still told.

The capacity is made small on purpose: one renewal per Redis call
(``RENEWAL_BATCH``) over a connection that takes a fifth of a second a
round trip (``FaultProxy``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import Lock, LockLostError, LockNotOwnedError
from django_redislock import signals as lock_signals
from django_redislock.holds import dropped
from django_redislock.holds.dropped import LostLeases, Summary
from django_redislock.holds.lag import Lag
from django_redislock.holds.settling import RETRY_LOG_EVERY
from django_redislock.holds.watchdog import watchdog
from tests.settings import redis_cache
from tests.support.faultproxy import FaultProxy


class Records(logging.Handler):
    """The WARNING records of one logger, each with when it came; ``wanted``
    is set once one's message contains ``until``."""

    def __init__(self, until: str) -> None:
        super().__init__(logging.INFO)
        self.until = until
        self.seen: list[tuple[float, str]] = []
        self.wanted = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.seen.append((time.monotonic(), message))
        if self.until in message:
            self.wanted.set()


@contextmanager
def records(logger: str, until: str) -> Iterator[Records]:
    handler = Records(until)
    logging.getLogger(logger).addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger(logger).removeHandler(handler)


@contextmanager
def losses(count: int) -> Iterator[tuple[list[tuple[float, str]], threading.Event]]:
    """``lock_lost`` as (when, name); the event is set at the ``count``-th."""
    lost: list[tuple[float, str]] = []
    enough = threading.Event()

    def on_lost(name: str, **kwargs: Any) -> None:
        lost.append((time.monotonic(), name))
        if len(lost) >= count:
            enough.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        yield lost, enough
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


@pytest.fixture
def fresh_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's watchdog with no recent loss logged, no lag warned."""
    monkeypatch.setattr(watchdog, "losses", LostLeases(logging.getLogger("test.losses")))
    monkeypatch.setattr(watchdog, "lagging", Lag(type(watchdog), watchdog._census))


def release_all(locks: list[Lock]) -> list[str]:
    """Release every lock; the names whose release raised ``LockLostError``."""
    lost = []
    for lock in locks:
        try:
            lock.release()
        except LockLostError:
            lost.append(lock.name)
        except LockNotOwnedError:
            pass
    return lost


@pytest.mark.usefixtures("fresh_reports")
def test_leases_lost_together_are_one_line_and_a_summary_each_holder_told(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    monkeypatch.setattr(dropped, "LOSS_INTERVAL", 2.0)
    locks = [Lock(f"lost:together:{i}", timeout=1.5) for i in range(12)]
    with records("test.losses", "more holds") as logged, losses(12) as (lost, all_lost):
        for lock in locks:
            assert lock.acquire()
        redis_client.delete(*[f"redislock:{{{lock.name}}}:lock" for lock in locks])
        assert all_lost.wait(10), f"only {len(lost)} of 12 told"
        assert logged.wanted.wait(10), logged.seen
    assert sorted(name for _, name in lost) == sorted(lock.name for lock in locks)
    assert sorted(release_all(locks)) == sorted(lock.name for lock in locks)
    [first, summary] = [message for _, message in logged.seen]
    assert first.startswith("Lost the lease of lock 'lost:together:")
    assert "the lease was gone when the watchdog renewed it" in first
    assert summary.startswith("Lost the leases of 11 more holds in the last 2 s (lock 'lost:")
    assert summary.count("'lost:together:") == dropped.LOSS_SAMPLE
    assert "and 6 more" in summary
    assert "the lease was gone when the watchdog renewed it (11)" in summary


def test_a_loss_after_a_quiet_interval_is_logged_in_full_at_once() -> None:
    log = LostLeases(logging.getLogger("test.losses"))
    with records("test.losses", "") as logged:
        assert not log.report("lock", "a", "h:1:t", 1.0, "gone")
        assert log.report("lock", "b", "h:1:t", 1.0, "gone")
        assert len(logged.seen) == 1
        assert log.due() < float("inf")
        log.flush()  # the interval is not over: nothing yet
        assert len(logged.seen) == 1
        log.flush(force=True)
        assert logged.seen[1][1].startswith("Lost the leases of 1 more holds")
        assert log.due() == float("inf")


@pytest.mark.usefixtures("fresh_reports")
def test_renewals_falling_behind_warn_once_before_the_first_loss(redis_url: str) -> None:
    """One renewal per call at 0.2 s a call is 5 renewals a second; 20 leases
    of 3 s owe 20. The warning (a fifth of a lease late) must come, once, with
    the holds at risk and what to do, and before the first lease is lost (two
    thirds of a lease late)."""
    options = {"SOCKET_TIMEOUT": 2.0, "SOCKET_CONNECT_TIMEOUT": 2.0}
    lagged: list[tuple[float, dict[str, Any]]] = []

    def on_lag(**kwargs: Any) -> None:
        lagged.append((time.monotonic(), kwargs))

    lock_signals.renewal_lag.connect(on_lag)
    with (
        FaultProxy(redis_url) as proxy,
        override_settings(
            CACHES={"default": redis_cache(proxy.url, **options)},
            REDISLOCK={"RENEWAL_BATCH": 1},
        ),
        records("django_redislock.watchdog", "running") as logged,
        losses(1) as (lost, one_lost),
    ):
        locks = [Lock(f"lagging:{i}", timeout=3.0) for i in range(20)]
        try:
            for lock in locks:
                assert lock.acquire()
            proxy.latency = 0.1  # each way
            assert logged.wanted.wait(10), "no lag warning"
            assert watchdog.lag() > 0.5
            assert one_lost.wait(15), "the overloaded watchdog lost nothing"
        finally:
            proxy.latency = 0.0
            lock_signals.renewal_lag.disconnect(on_lag)
            with suppress(Exception):
                release_all(locks)
    warnings = [(at, message) for at, message in logged.seen if "running" in message]
    assert len(warnings) == 1, warnings
    warned_at, message = warnings[0]
    assert warned_at < lost[0][0], "the first lease was lost before the warning"
    assert "of the 20 holds this process renews at risk" in message
    assert "longer leases" in message and "fewer holds per process" in message
    at, first = lagged[0]
    assert first["lagging"] is True
    assert first["holds"] == 20 and 1 <= first["at_risk"] <= 20
    assert first["share"] > 0.2 and first["lag"] > 0.6
    assert first["sender"] is type(watchdog)
    assert at < lost[0][0]


def test_renewals_failing_together_are_logged_a_line_a_second(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server down fails every renewal held on it, each retried: one line
    (a second at most) says so, not one per lease."""
    from django_redislock import LockBackendError

    class Holding:
        lease_deadline = time.monotonic() + 60

    retries = Summary(RETRY_LOG_EVERY)
    monkeypatch.setattr(watchdog.settling, "_retries", retries)
    started = time.monotonic()
    for i in range(50):
        error = LockBackendError(f"Redis is unreachable for lock 'down:{i}'", name=f"down:{i}")
        watchdog.settling._failed(Holding(), started, error)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert lines == ["Lease renewal failed, retrying: Redis is unreachable for lock 'down:0'"]
    retries.last_line -= 2  # a second past: the next failure's line says how many more
    watchdog.settling._failed(Holding(), started, error)  # type: ignore[arg-type]
    assert "(49 more failed since the last such line)" in caplog.records[-1].getMessage()
    assert retries.count == 0


def test_the_lag_is_told_when_it_starts_and_ends_and_warned_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_redislock.watchdog")
    lagged: list[dict[str, Any]] = []

    def on_lag(**kwargs: Any) -> None:
        lagged.append(kwargs)

    lag = Lag(type(watchdog), lambda: (7, 40, 120.0))
    lock_signals.renewal_lag.connect(on_lag)
    try:
        now = time.monotonic()
        lag.observe(0.3, 0.15, 256, now)  # under a fifth of the lease: nothing
        lag.observe(0.5, 0.25, 256, now)
        lag.observe(0.6, 0.3, 256, now)  # still behind: told once
        lag.observe(0.1, 0.05, 256, now + 1)  # caught up
        lag.observe(0.5, 0.25, 256, now + 2)  # behind again, within the minute
    finally:
        lock_signals.renewal_lag.disconnect(on_lag)
    assert [call["lagging"] for call in lagged] == [True, False, True]
    assert lagged[0]["at_risk"] == 7 and lagged[0]["holds"] == 40
    assert lagged[0]["lag"] == 0.5 and lagged[0]["share"] == 0.25
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "0.50 s late (25% of a lease) with 7 of the 40 holds" in warnings[0].getMessage()
    assert "owes 120" in warnings[0].getMessage()
    assert any(r.getMessage().startswith("Lease renewals caught up") for r in caplog.records)
    assert lag.last == 0.5


def test_the_summary_core_logs_the_first_then_counts_with_bounded_keys_and_sample() -> None:
    """``Summary``: what the outage log, the lost-lease log and the retry line share."""
    summary: Summary[str] = Summary(5.0, kept=2, sample=1)
    assert summary.quiet(100.0)  # the first after a quiet interval: logged in full
    assert not summary.quiet(101.0) and summary.due() == float("inf")  # nothing counted yet
    for key in ["a", "b", "c", "a"]:
        summary.add(key, f"item {key}")
    assert not summary.quiet(200.0)  # counted ones wait for their line
    assert summary.due() == 105.0
    assert summary.take(105.0) == (4, {"a": 2, "b": 1}, ["item a"])  # "c": in the count only
    assert summary.count == 0 and not summary.quiet(109.0) and summary.quiet(110.0)
