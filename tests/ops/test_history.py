"""Per-minute history for the hot-names panel: recording, reading, ranking."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from django_redislock import Lock, Semaphore, signals
from django_redislock.holds import counters
from django_redislock.holds import writer as background
from django_redislock.ops import history as hot
from tests.support.servers import RedisServer
from tests.support.threads import refuse_threads
from tests.support.writers import drain


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_until_written(client: redis.Redis, field: str) -> None:
    """Until this minute's history has ``field`` (the background thread wrote it)."""
    key = hot.minute_key("redislock", int(time.time() // 60))
    deadline = time.monotonic() + 20
    while not client.hget(key, field):
        assert time.monotonic() < deadline, "the tally was never written"
        time.sleep(0.05)


def recorder(client: redis.Redis, clock: Clock) -> hot.Recorder:
    return hot.Recorder(lambda: (client, "redislock"), clock, background=False)


def test_tally_is_written_by_one_pipelined_flush() -> None:
    """On a server of its own: its command counts are every client's, and the
    suite's server is shared with processes some tests start, whose
    background writes (three more HINCRBY) landed in this count once."""
    with RedisServer() as private:
        redis_client = redis.Redis.from_url(private.url)
        clock = Clock(6000.0)  # minute 100
        rec = recorder(redis_client, clock)
        rec.acquired(None, name="sku:1", waited=0.0)
        rec.acquired(None, name="sku:1", waited=0.3)
        rec.contended(None, name="sku:1", waited=2.0)
        key = hot.minute_key("redislock", 100)
        assert not redis_client.exists(key)  # receivers never write
        redis_client.config_resetstat()
        rec.flush()
        fields = {k.decode(): int(v) for k, v in redis_client.hgetall(key).items()}
        assert fields == {
            "sku:1\x1facquired": 2,
            "sku:1\x1fwaits": 2,
            "sku:1\x1ftimeouts": 1,
            "sku:1\x1fwait_ms": 2300,
            "sku:1\x1fw0": 1,
            f"sku:1\x1fw{hot.bucket(300)}": 1,
            f"sku:1\x1fw{hot.bucket(2000)}": 1,  # the timeout's wait
        }
        assert 0 < redis_client.ttl(key) <= hot.KEEP_SECONDS
        stats = redis_client.info("commandstats")
        assert stats["cmdstat_hincrby"]["calls"] == 7
        assert stats["cmdstat_expire"]["calls"] == 1
        redis_client.close()


def test_the_background_thread_writes_within_seconds(redis_client: redis.Redis) -> None:
    rec = hot.Recorder(lambda: (redis_client, "redislock"))
    rec.lost(None, name="gone")
    wait_until_written(redis_client, "gone\x1flost")
    drain(rec)  # its thread ends


def test_reset_forgets_the_parents_tally(redis_client: redis.Redis) -> None:
    rec = recorder(redis_client, Clock(6000.0))
    rec.lost(None, name="x")
    rec.reset()
    rec.flush()
    assert not redis_client.exists(hot.minute_key("redislock", 100))


def test_a_redis_failure_never_reaches_the_lock() -> None:
    def broken() -> tuple[Any, str]:
        raise redis.ConnectionError("down")

    rec = hot.Recorder(broken, Clock(0.0))
    rec.lost(None, name="x")
    rec.flush()  # logged at DEBUG, not raised
    drain(rec)


def test_a_thread_that_cannot_start_is_tried_again(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One refused start left the thread set but never running: the history
    was never written again and the tally grew for good."""
    refused = refuse_threads(monkeypatch, background)
    rec = hot.Recorder(lambda: (redis_client, "redislock"))
    rec.lost(None, name="x")
    rec.lost(None, name="x")
    assert len(refused) == 2  # each record tries again
    monkeypatch.undo()  # threads start again
    rec.lost(None, name="started")
    wait_until_written(redis_client, "started\x1flost")
    drain(rec)


def test_installing_again_replaces_the_recorder(redis_client: redis.Redis) -> None:
    """``AppConfig.ready()`` runs again when a test overrides INSTALLED_APPS:
    every acquire must still be recorded once."""
    before = hot._installed()
    assert len(before) == 1  # the app's own, from ready()
    try:
        newer = hot.install()
        assert hot._installed() == {newer}
        assert sum(1 for r in signals.tapped(signals.lock_acquired) if r == newer.acquired) == 1
        assert counters.TALLY.on_unwaited == newer.add_unwaited
        with Lock("installed-twice"):  # counted with the counters, handed over at their flush
            pass
        with Semaphore("installed-twice", 2):  # through lock_acquired
            pass
        counters.TALLY.hand_over()
        assert sum(c[0] for c in newer._tally.values()) == 2
        assert all(not old._tally for old in before)
    finally:
        newer.stop()
        for signal, receiver in hot._receivers(newer):
            signals.untap(signal, receiver)
        for old in before:  # the app's own again, as the other tests expect
            for signal, receiver in hot._receivers(old):
                signals.tap(signal, receiver, counted=signal is signals.lock_acquired)
            counters.TALLY.on_unwaited = old.add_unwaited
            counters.TALLY.on_first_unwaited = old.wake


def test_a_hung_redis_holds_the_flush_up_for_the_write_timeout_only(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush at exit: before, it waited out the client's socket timeout."""
    from tests.support.faultproxy import FaultProxy

    monkeypatch.setattr("django_redislock.holds.counters.WRITE_TIMEOUT", 0.5)
    with FaultProxy(redis_url) as proxy:
        hung = redis.Redis.from_url(proxy.url)  # no socket timeout of its own
        rec = hot.Recorder(lambda: (hung, "redislock"), background=False)
        rec.lost(None, name="x")
        proxy.blackhole()
        started = time.monotonic()
        rec.flush()
        assert time.monotonic() - started < 5
        proxy.heal()
        hung.close()


def test_percentiles_are_bucket_bounds() -> None:
    waits = Counter({"w0": 90, f"w{hot.bucket(150)}": 9, f"w{hot.bucket(4000)}": 1})
    assert hot.percentile(waits, 0.5) == 1
    assert hot.percentile(waits, 0.95) == 200
    assert hot.percentile(waits, 1.0) == 5000
    assert hot.percentile(Counter(), 0.5) is None


def test_a_flush_returns_after_the_write_already_in_flight(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush while the thread's write is in flight waits for it: one that
    found the tally already taken returned before its records were written."""
    from redis.client import Pipeline

    clock = Clock(60 * 3000.0)
    rec = recorder(redis_client, clock)
    execute, entered, go = Pipeline.execute, threading.Event(), threading.Event()

    def slow(self: Pipeline, *args: Any, **kwargs: Any) -> Any:
        if not entered.is_set():
            entered.set()
            go.wait(5)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", slow)
    rec.lost(None, name="in-flight")
    writer = threading.Thread(target=rec.flush)  # as the writing thread's
    writer.start()
    assert entered.wait(5)
    threading.Timer(0.2, go.set).start()  # the in-flight write lands later
    rec.flush()
    assert redis_client.hget(hot.minute_key("redislock", 3000), "in-flight\x1flost") == b"1"
    writer.join(5)


def test_waits_that_timed_out_are_in_the_percentiles(redis_client: redis.Redis) -> None:
    """A name whose waiters mostly give up after 5 s: its p95 wait is 5 s,
    not the wait of the one acquire that got it at once."""
    clock = Clock(60 * 2000.0)
    rec = recorder(redis_client, clock)
    rec.acquired(None, name="stuck", waited=0.0)
    for _ in range(19):
        rec.contended(None, name="stuck", waited=5.0)
    rec.flush()
    history = hot.read(redis_client, "redislock", clock.now, minutes=60)
    (stuck,) = hot.hot_names(history, window=5, order="timeouts")
    assert (stuck.p50_ms[-1], stuck.p95_ms[-1]) == (5000, 5000)


def test_ranking_over_a_window_with_hourly_series(redis_client: redis.Redis) -> None:
    clock = Clock(60 * 1000.0)
    rec = recorder(redis_client, clock)
    for _ in range(5):  # ten minutes ago: "old" was hot
        rec.contended(None, name="old", waited=1.0)
    clock.now += 600
    rec.acquired(None, name="new", waited=0.01)
    rec.flush()
    history = hot.read(redis_client, "redislock", clock.now, minutes=60)
    assert len(history) == 60
    assert [h.name for h in hot.hot_names(history, window=5, order="waits")] == ["new"]
    ranked = hot.hot_names(history, window=15, order="waits")
    assert [(h.name, h.totals["waits"]) for h in ranked] == [("old", 5), ("new", 1)]
    new = ranked[1]
    assert len(new.acquired) == len(new.p95_ms) == 60
    assert new.acquired[-1] == 1
    assert new.p50_ms[-1] == 10
    assert new.p95_ms[:-1] == [None] * 59


def test_an_acquire_that_did_not_wait_reaches_the_history_through_the_counters(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncontended Lock acquire is counted once, with the counters
    (``counters.acquired_at_once``): the history's own tap (``counted=True``)
    does not run for it, other taps do, and the history gets it at the
    counters' hand-over, in that minute."""
    clock = Clock(6000.0)  # minute 100
    rec = recorder(redis_client, clock)
    tally = counters.Tally(background=False)
    tally.on_unwaited = rec.add_unwaited
    monkeypatch.setattr("django_redislock.holds.counters.acquired_at_once", tally.acquired_at_once)
    tapped: list[str] = []
    counted: list[str] = []
    signals.tap(signals.lock_acquired, lambda **kw: tapped.append(kw["name"]))
    signals.tap(signals.lock_acquired, lambda **kw: counted.append(kw["name"]), counted=True)
    try:
        for _ in range(3):
            with Lock("sku:free"):
                pass
    finally:
        for receiver in signals.tapped(signals.lock_acquired)[-2:]:
            signals.untap(signals.lock_acquired, receiver)
    assert tapped == ["sku:free"] * 3
    assert counted == []
    assert not rec._tally  # nothing until the hand-over
    tally.flush()  # the counters' flush hands the history its count
    rec.flush()
    fields = {
        k.decode(): int(v)
        for k, v in redis_client.hgetall(hot.minute_key("redislock", 100)).items()
    }
    assert fields == {"sku:free\x1facquired": 3, "sku:free\x1fw0": 3}


def test_a_failing_history_never_stops_the_counters(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    tally = counters.Tally(background=False)

    def broken(counts: dict[str, int]) -> None:
        raise RuntimeError("history down")

    tally.on_unwaited = broken
    client = redis_client
    tally.acquired_at_once(client, b"redislock:{sku:x}:stats", 60_000, "sku:x")
    tally.flush()
    assert redis_client.hget("redislock:{sku:x}:stats", "acquired") == b"1"
    assert "Could not hand the lock history its counts" in caplog.text


def test_a_flush_writes_what_the_counters_hold_without_starting_a_thread(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush (at exit too, when Python 3.12 refuses new threads) takes the
    counters' unwaited acquires and writes them itself: it starts no thread
    for them."""
    refused = refuse_threads(monkeypatch, background)
    clock = Clock(6000.0)
    rec = hot.Recorder(lambda: (redis_client, "redislock"), clock)
    tally = counters.Tally(background=False)
    tally.on_unwaited = rec.add_unwaited
    monkeypatch.setattr("django_redislock.holds.counters.TALLY", tally)
    tally.acquired_at_once(redis_client, b"redislock:{sku:exit}:stats", 60_000, "sku:exit")
    rec.flush()
    assert refused == []
    written = redis_client.hgetall(hot.minute_key("redislock", 100))
    assert written == {b"sku:exit\x1facquired": b"1", b"sku:exit\x1fw0": b"1"}


def test_a_stopped_recorder_starts_no_thread_for_a_late_hand_over(
    redis_client: redis.Redis,
) -> None:
    """``install`` points the counters at the new recorder before it stops the
    old one; a hand-over already on its way to the old one must not start a
    thread there again (it would never end, and keep the old recorder)."""
    rec = hot.Recorder(lambda: (redis_client, "redislock"))
    rec.stop()
    rec.add_unwaited({"late": 1})
    assert rec._thread is None
    rec.flush()
    assert redis_client.hget(
        hot.minute_key("redislock", int(time.time() // 60)), "late\x1facquired"
    )


def test_the_first_unwaited_acquire_starts_the_history_thread(redis_client: redis.Redis) -> None:
    """Its counts wait in the counters, but the history's writing thread
    starts with the first of them, as it did with its own tally: at exit
    (Python 3.12 starts no thread there) only a running thread makes the
    last write of a pool with no plain sibling."""
    rec = hot.Recorder(lambda: (redis_client, "redislock"))
    tally = counters.Tally(background=False)
    tally.on_unwaited, tally.on_first_unwaited = rec.add_unwaited, rec.wake
    assert rec._thread is None
    tally.acquired_at_once(redis_client, b"redislock:{sku:w}:stats", 60_000, "sku:w")
    try:
        assert rec._thread is not None
    finally:
        tally.take_unwaited()
        drain(rec)
