"""The OpenTelemetry integration, with the SDK's in-memory exporter and reader, on real Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_redislock import Lock, LockLostError, Semaphore, otel
from tests.support.signals_helper import time_out_in_another_thread


class Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def install(self, **kwargs: Any) -> otel.Recorder:
        return otel.install(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kwargs
        )

    def spans(self, span_name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == span_name]

    def points(self, metric_name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == metric_name:
                        found.extend(metric.data.data_points)
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    recorded = Telemetry()
    recorded.install()
    yield recorded
    otel.uninstall()


def test_a_lock_use_makes_a_wait_and_a_hold_span_and_histograms(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request, Lock("otel:a"):
        pass
    [wait] = telemetry.spans("redislock.wait")
    [hold] = telemetry.spans("redislock.hold")
    assert dict(wait.attributes or {}) == {
        "redislock.name": "otel:a",
        "redislock.kind": "lock",
        "redislock.outcome": "acquired",
        "redislock.wait_seconds": pytest.approx(wait.attributes["redislock.wait_seconds"]),  # type: ignore[index]
    }
    assert 0 <= wait.attributes["redislock.wait_seconds"] < 5  # type: ignore[index,operator]
    assert hold.attributes["redislock.outcome"] == "released"  # type: ignore[index]
    # under the request's span, and the hold starts where the wait ends
    assert wait.parent is not None and wait.parent.span_id == request.get_span_context().span_id
    assert hold.parent is not None and hold.parent.span_id == request.get_span_context().span_id
    assert wait.end_time is not None and hold.start_time is not None
    assert hold.start_time <= hold.end_time  # type: ignore[operator]
    [held] = telemetry.points("redislock.hold.duration")
    assert held.count == 1
    assert held.attributes == {"redislock.kind": "lock", "redislock.outcome": "released"}
    [waited] = telemetry.points("redislock.wait.duration")
    assert waited.count == 1


def test_a_lock_on_django_valkey_makes_the_same_spans(telemetry: Telemetry, redis_url: str) -> None:
    """valkey-py has no OpenTelemetry instrumentation of its own: the locks'
    spans and histograms are recorded by this library, whichever client
    library the cache is on."""
    from django.test import override_settings

    valkey_cache = {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": redis_url,
        "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5},
    }
    with override_settings(CACHES={"default": valkey_cache}), Lock("otel:valkey"):
        pass
    [wait] = telemetry.spans("redislock.wait")
    [hold] = telemetry.spans("redislock.hold")
    assert wait.attributes["redislock.outcome"] == "acquired"  # type: ignore[index]
    assert hold.attributes["redislock.outcome"] == "released"  # type: ignore[index]
    assert hold.attributes["redislock.name"] == "otel:valkey"  # type: ignore[index]
    [held] = telemetry.points("redislock.hold.duration")
    assert held.count == 1


def test_a_real_wait_is_timed_and_a_timeout_is_counted(telemetry: Telemetry) -> None:
    time_out_in_another_thread("otel:busy", 0.3)
    waits = telemetry.spans("redislock.wait")
    timeouts = [s for s in waits if (s.attributes or {}).get("redislock.outcome") == "timeout"]
    assert len(timeouts) == 1
    assert timeouts[0].attributes["redislock.wait_seconds"] >= 0.25  # type: ignore[index,operator]
    duration = (timeouts[0].end_time or 0) - (timeouts[0].start_time or 0)
    assert duration >= 0.25e9
    [counted] = telemetry.points("redislock.timeouts")
    assert counted.value == 1
    assert counted.attributes == {"redislock.kind": "lock", "redislock.outcome": "timeout"}


def test_a_timed_out_wait_span_says_who_held_the_name(telemetry: Telemetry) -> None:
    error = time_out_in_another_thread("otel:held", 0.2)
    [span] = [
        s
        for s in telemetry.spans("redislock.wait")
        if (s.attributes or {}).get("redislock.outcome") == "timeout"
    ]
    attributes = dict(span.attributes or {})
    assert error.holder is not None
    assert attributes["redislock.holder"] == error.holder.holder
    assert attributes["redislock.holder.pid"] == os.getpid()
    assert attributes["redislock.held_for_seconds"] == error.held_for
    [counted] = telemetry.points("redislock.timeouts")  # metrics stay free of pids
    assert counted.attributes == {"redislock.kind": "lock", "redislock.outcome": "timeout"}


def test_a_lost_lease_is_counted_and_its_hold_span_says_so(
    telemetry: Telemetry, redis_client: redis.Redis
) -> None:
    from django_redislock.conf import get_settings
    from django_redislock.ops import inspection

    lock = Lock("otel:lost", auto_renew=False)
    lock.acquire()
    assert inspection.clear(redis_client, get_settings().key_prefix, "otel:lost") == 1
    with pytest.raises(LockLostError):
        lock.release()
    [hold] = telemetry.spans("redislock.hold")
    assert hold.attributes["redislock.outcome"] == "lost"  # type: ignore[index]
    [lost] = telemetry.points("redislock.lost_leases")
    assert lost.value == 1


def test_a_lost_hold_says_whether_max_hold_stopped_it(
    telemetry: Telemetry, redis_client: redis.Redis
) -> None:
    import threading

    told = threading.Event()
    with (
        pytest.raises(LockLostError),
        Lock("otel:capped", timeout=0.6, max_hold=0.5, on_lost=lambda hold: told.set()),
    ):
        assert told.wait(10)
    lock = Lock("otel:cleared", auto_renew=False)
    lock.acquire()
    redis_client.delete("redislock:{otel:cleared}:lock")
    with pytest.raises(LockLostError):
        lock.release()
    capped, cleared = telemetry.spans("redislock.hold")
    assert capped.attributes["redislock.lost_cause"] == "max_hold"  # type: ignore[index]
    assert "held longer than max_hold=0.5s" in capped.attributes["redislock.lost_reason"]  # type: ignore[index,operator]
    assert cleared.attributes["redislock.lost_cause"] == "lease"  # type: ignore[index]
    causes = sorted(
        p.attributes["redislock.lost_cause"] for p in telemetry.points("redislock.lost_leases")
    )
    assert causes == ["lease", "max_hold"]


def test_semaphores_and_bounded_names_in_metrics(telemetry: Telemetry) -> None:
    telemetry.install(metric_name=lambda name: name.partition(":")[0])
    with Semaphore("pool:db", limit=2):
        pass
    [hold] = telemetry.spans("redislock.hold")
    assert hold.attributes["redislock.kind"] == "semaphore"  # type: ignore[index]
    [held] = telemetry.points("redislock.hold.duration")
    assert held.attributes["redislock.name"] == "pool"


def test_install_twice_records_once_and_uninstall_stops(telemetry: Telemetry) -> None:
    telemetry.install()
    with Lock("otel:once"):
        pass
    assert len(telemetry.spans("redislock.hold")) == 1
    otel.uninstall()
    with Lock("otel:after"):
        pass
    assert len(telemetry.spans("redislock.hold")) == 1


def test_the_watchdogs_lag_and_holds_are_gauges_and_falling_behind_is_counted(
    telemetry: Telemetry,
) -> None:
    from django_redislock import signals
    from django_redislock.holds.watchdog import Watchdog

    with Lock("otel:renewed", timeout=30):
        [lag] = telemetry.points("redislock.renewal.lag")
        [holds] = telemetry.points("redislock.renewal.holds")
    assert 0 <= lag.value < 1
    assert holds.value == 1
    common = {"lag": 0.5, "share": 0.25, "at_risk": 3, "holds": 9}
    signals.notify(signals.renewal_lag, sender=Watchdog, lagging=True, **common)
    signals.notify(signals.renewal_lag, sender=Watchdog, lagging=False, **common)
    [lagging] = telemetry.points("redislock.renewal.lagging")
    assert lagging.value == 1
