"""Per-minute history for the hot-names panel: recording (in the one tally of
lock use, ``holds/counters.py``), reading, ranking."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from django_redislock import Lock, ReadWriteLock, Semaphore, signals
from django_redislock.holds import counters
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
    """Until the history has ``field`` (the background thread wrote it) in
    a minute from this one on: a write that lands after the minute turns is
    in the next minute's hash, and a wait that read this minute's alone
    waited for ever (a fresh-clone CI run met it)."""
    first = int(time.time() // 60)
    deadline = time.monotonic() + 20
    while not any(
        client.hget(hot.minute_key("redislock", minute), field)
        for minute in range(first, int(time.time() // 60) + 1)
    ):
        assert time.monotonic() < deadline, "the tally was never written"
        time.sleep(0.05)


def recorder(client: Any, clock: Any = time.time, *, background: bool = False) -> counters.Tally:
    """A tally of the test's own, its history written to ``client``."""
    return counters.Tally(background=background, clock=clock, history=lambda: (client, "redislock"))


def acquired(tally: counters.Tally, name: str, waited: float = 0.0) -> None:
    """An acquire of a kind with no counters of its own (the history's only)."""
    tally.acquired(None, None, 0, name, waited)


def lost(tally: counters.Tally, name: str) -> None:
    tally.lost(None, None, 0, name)


def test_tally_is_written_by_one_pipelined_flush() -> None:
    """On a server of its own: its command counts are every client's, and the
    suite's server is shared with processes some tests start, whose
    background writes (three more HINCRBY) landed in this count once."""
    with RedisServer() as private:
        redis_client = redis.Redis.from_url(private.url)
        clock = Clock(6000.0)  # minute 100
        rec = recorder(redis_client, clock)
        acquired(rec, "sku:1")
        acquired(rec, "sku:1", 0.3)
        rec.contended("sku:1", 2.0)
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
    rec = recorder(redis_client, background=True)
    lost(rec, "gone")
    wait_until_written(redis_client, "gone\x1flost")
    drain(rec)  # its thread ends


def test_reset_forgets_the_parents_tally(redis_client: redis.Redis) -> None:
    rec = recorder(redis_client, Clock(6000.0))
    lost(rec, "x")
    rec.reset()
    rec.flush()
    assert not redis_client.exists(hot.minute_key("redislock", 100))


def test_a_redis_failure_never_reaches_the_lock() -> None:
    def broken() -> tuple[Any, str]:
        raise redis.ConnectionError("down")

    rec = counters.Tally(clock=Clock(0.0), history=broken)
    lost(rec, "x")
    rec.flush()  # logged, not raised
    drain(rec)


def test_a_thread_that_cannot_start_is_tried_again(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One refused start left the thread set but never running: the history
    was never written again and the tally grew for good."""
    refused = refuse_threads(monkeypatch, counters)
    rec = recorder(redis_client, background=True)
    lost(rec, "x")
    lost(rec, "x")
    assert len(refused) == 2  # each record tries again
    monkeypatch.undo()  # threads start again
    lost(rec, "started")
    wait_until_written(redis_client, "started\x1flost")
    drain(rec)


def test_an_unwaited_acquire_of_every_kind_reaches_the_minute_history(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted where each primitive knows what happened: a Lock's acquire
    that did not wait (with its counters), a Semaphore's and a
    ReadWriteLock's; a receiver of ``lock_acquired`` is still sent each."""
    monkeypatch.setattr(counters.TALLY, "_clock", Clock(6000.0))  # minute 100
    heard: list[str] = []

    def receiver(sender: Any, name: str, **_: Any) -> None:
        heard.append(name)

    signals.lock_acquired.connect(receiver)
    try:
        for _ in range(3):
            with Lock("sku:free"):
                pass
        with Semaphore("sku:pool", 2):
            pass
        with ReadWriteLock("sku:rw").read():
            pass
    finally:
        signals.lock_acquired.disconnect(receiver)
    assert heard == ["sku:free"] * 3 + ["sku:pool", "sku:rw"]
    counters.flush()
    fields = {
        k.decode(): int(v)
        for k, v in redis_client.hgetall(hot.minute_key("redislock", 100)).items()
    }
    assert fields == {
        "sku:free\x1facquired": 3, "sku:free\x1fw0": 3,
        "sku:pool\x1facquired": 1, "sku:pool\x1fw0": 1,
        "sku:rw\x1facquired": 1, "sku:rw\x1fw0": 1,
    }  # fmt: skip
    assert redis_client.hget("redislock:{sku:free}:stats", "acquired") == b"3"


def test_a_hung_redis_holds_the_flush_up_for_the_write_timeout_only(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush at exit: before, it waited out the client's socket timeout."""
    from tests.support.faultproxy import FaultProxy

    monkeypatch.setattr("django_redislock.holds.counters.WRITE_TIMEOUT", 0.5)
    with FaultProxy(redis_url) as proxy:
        hung = redis.Redis.from_url(proxy.url)  # no socket timeout of its own
        rec = recorder(hung)
        lost(rec, "x")
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
    lost(rec, "in-flight")
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
    acquired(rec, "stuck")
    for _ in range(19):
        rec.contended("stuck", 5.0)
    rec.flush()
    history = hot.read(redis_client, "redislock", clock.now, minutes=60)
    (stuck,) = hot.hot_names(history, window=5, order="timeouts")
    assert (stuck.p50_ms[-1], stuck.p95_ms[-1]) == (5000, 5000)


def test_ranking_over_a_window_with_hourly_series(redis_client: redis.Redis) -> None:
    clock = Clock(60 * 1000.0)
    rec = recorder(redis_client, clock)
    for _ in range(5):  # ten minutes ago: "old" was hot
        rec.contended("old", 1.0)
    rec.flush()  # the minute is the write's
    clock.now += 600
    acquired(rec, "new", 0.01)
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


def test_a_failing_history_never_stops_the_counters(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> tuple[Any, str]:
        raise RuntimeError("history down")

    tally = counters.Tally(background=False, history=broken)
    tally.acquired(redis_client, b"redislock:{sku:x}:stats", 60_000, "sku:x")
    tally.flush()
    assert redis_client.hget("redislock:{sku:x}:stats", "acquired") == b"1"
    assert "Could not write the per-minute lock history" in caplog.text


def test_the_last_write_at_exit_carries_the_history(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At exit (``close``) the one writing thread makes the last write of both
    the counters and the minute's history; no thread is started for it (Python
    3.12 refuses new threads there)."""
    rec = recorder(redis_client, Clock(6000.0), background=True)
    rec.acquired(redis_client, b"redislock:{sku:exit}:stats", 60_000, "sku:exit")
    assert rec._thread is not None  # started by the first count
    refused = refuse_threads(monkeypatch, counters)
    rec.close()
    assert refused == []
    written = redis_client.hgetall(hot.minute_key("redislock", 100))
    assert written == {b"sku:exit\x1facquired": b"1", b"sku:exit\x1fw0": b"1"}
    assert redis_client.hget("redislock:{sku:exit}:stats", "acquired") == b"1"
    drain(rec)


def test_one_thread_writes_the_counters_and_the_history(redis_client: redis.Redis) -> None:
    """The name's counters and its minute go out in one pipeline, from one thread."""
    rec = recorder(redis_client, background=True)
    rec.acquired(redis_client, b"redislock:{sku:one}:stats", 60_000, "sku:one", 0.2)
    rec.contended("sku:one", 1.0)
    lost(rec, "sku:other")
    writers = [t for t in threading.enumerate() if t.name == counters.Tally.thread_name]
    assert rec._thread in writers
    wait_until_written(redis_client, "sku:one\x1ftimeouts")
    assert redis_client.hget("redislock:{sku:one}:stats", "wait_ms") == b"200"
    drain(rec)
