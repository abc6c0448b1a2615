"""OpenTelemetry spans and metrics for every primitive, built on the signals.

Optional (``pip install django-redislock[otel]``, which adds only
``opentelemetry-api``) and off until :func:`install` is called, typically
from an ``AppConfig.ready()``. The core never imports this module: it only
sends ``django_redislock.signals``, and ``install`` connects receivers that
turn them into telemetry. Without an SDK configured, the API's no-op
providers make every call here nearly free.

What is recorded, for each primitive (``Lock``, ``Semaphore``, ...):

- spans ``redislock.wait`` (from the start of the wait to the acquire or the
  timeout) and ``redislock.hold`` (from the acquire to the release or the
  loss), back-dated from the signals' timings, in the context of the thread
  or task that waited or held (so under the request's span);
- histograms ``redislock.wait.duration`` and ``redislock.hold.duration``
  (seconds);
- counters ``redislock.timeouts`` and ``redislock.lost_leases``;
- for the process's watchdog: gauges ``redislock.renewal.lag`` (seconds the
  oldest renewal due is late; leases are lost once it passes two thirds of
  their length) and ``redislock.renewal.holds`` (leases it renews), and the
  counter ``redislock.renewal.lagging`` (times it fell behind by more than a
  fifth of a lease: ``signals.renewal_lag``).

Span attributes: ``redislock.name``, ``redislock.kind``, ``redislock.outcome``
(``acquired``, ``timeout``, ``released``, ``lost``) and
``redislock.wait_seconds`` on waits; a wait that timed out adds who held the
name, when the refusal said (``LockTimeout.holder``): ``redislock.holder``
(its ``host:pid:thread | runs``), ``redislock.holder.pid`` and
``redislock.held_for_seconds``; a lost hold's span also has
``redislock.lost_reason`` (``lock_lost``'s ``reason``) and
``redislock.lost_cause``: ``max_hold`` when the watchdog stopped renewing it
at its ``max_hold``, else ``lease`` (also an attribute of
``redislock.lost_leases``). Metric attributes are otherwise the kind and the
outcome only: lock names such as ``sku:42`` would make one time series per
row. Pass ``metric_name=`` to add a bounded form of the name (for example
``lambda name: name.partition(":")[0]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from django_redislock import signals
from django_redislock.holds.losses import CAPPED_PREFIX

_UID = "django_redislock.otel"
_SCOPE = "django_redislock"


class Recorder:
    """The receivers; ``install`` connects one, ``uninstall`` disconnects it."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        metric_name: Callable[[str], str | None] | None,
    ) -> None:
        self.tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self.metric_name = metric_name
        self.wait_duration = meter.create_histogram(
            "redislock.wait.duration", unit="s", description="Time spent waiting for a primitive."
        )
        self.hold_duration = meter.create_histogram(
            "redislock.hold.duration", unit="s", description="Time a primitive was held."
        )
        self.timeouts = meter.create_counter(
            "redislock.timeouts", description="Waits that gave up (LockTimeout)."
        )
        self.lost_leases = meter.create_counter(
            "redislock.lost_leases", description="Holds whose lease was lost (LockLostError)."
        )
        self.lagging = meter.create_counter(
            "redislock.renewal.lagging",
            description="Times the watchdog's renewals fell behind by a fifth of a lease.",
        )
        meter.create_observable_gauge(
            "redislock.renewal.lag",
            callbacks=[self._lag],
            unit="s",
            description="How late the watchdog's oldest due renewal is (lost at 2/3 of a lease).",
        )
        meter.create_observable_gauge(
            "redislock.renewal.holds",
            callbacks=[self._holds],
            description="Leases the process's watchdog renews.",
        )

    @staticmethod
    def _lag(options: CallbackOptions) -> list[Observation]:
        from django_redislock.holds.watchdog import watchdog

        return [Observation(watchdog.lag())]

    @staticmethod
    def _holds(options: CallbackOptions) -> list[Observation]:
        from django_redislock.holds.watchdog import watchdog

        return [Observation(watchdog.watching())]

    def _metric_attributes(self, name: str, kind: str, outcome: str) -> dict[str, str]:
        attributes = {"redislock.kind": kind, "redislock.outcome": outcome}
        if self.metric_name is not None:
            bounded = self.metric_name(name)
            if bounded is not None:
                attributes["redislock.name"] = bounded
        return attributes

    def _span(self, span_name: str, seconds: float, attributes: dict[str, Any]) -> None:
        end = time.time_ns()
        span = self.tracer.start_span(
            span_name, start_time=end - int(seconds * 1e9), attributes=attributes
        )
        span.end(end_time=end)

    def _wait(
        self, name: str, kind: str, waited: float, outcome: str, blocker: Any = None
    ) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "redislock.name": name,
            "redislock.kind": kind,
            "redislock.outcome": outcome,
            "redislock.wait_seconds": waited,
        }
        if blocker is not None:
            attributes.update(blocker)
        self._span("redislock.wait", waited, attributes)
        self.wait_duration.record(waited, self._metric_attributes(name, kind, outcome))
        return attributes

    def _hold(
        self, name: str, kind: str, held: float, outcome: str, extra: dict[str, str] | None = None
    ) -> None:
        attributes = {"redislock.name": name, "redislock.kind": kind, "redislock.outcome": outcome}
        if extra:
            attributes.update(extra)
        self._span("redislock.hold", held, attributes)
        self.hold_duration.record(held, self._metric_attributes(name, kind, outcome))

    def acquired(self, *, name: str, kind: str, waited: float, **_: Any) -> None:
        self._wait(name, kind, waited, "acquired")

    def contended(
        self,
        *,
        name: str,
        kind: str,
        waited: float,
        holder: Any = None,
        held_for: float | None = None,
        **_: Any,
    ) -> None:
        blocker = None
        if holder is not None:  # span attributes only: a pid per series would not do
            blocker = {"redislock.holder": holder.holder, "redislock.holder.pid": holder.pid or 0}
            if held_for is not None:
                blocker["redislock.held_for_seconds"] = held_for
        self._wait(name, kind, waited, "timeout", blocker)
        self.timeouts.add(1, self._metric_attributes(name, kind, "timeout"))

    def released(self, *, name: str, kind: str, held: float, **_: Any) -> None:
        self._hold(name, kind, held, "released")

    def lost(self, *, name: str, kind: str, held: float, reason: str = "", **_: Any) -> None:
        cause = "max_hold" if reason.startswith(CAPPED_PREFIX) else "lease"
        span_extra = {"redislock.lost_cause": cause, "redislock.lost_reason": reason}
        self._hold(name, kind, held, "lost", span_extra)
        attributes = self._metric_attributes(name, kind, "lost")
        attributes["redislock.lost_cause"] = cause
        self.lost_leases.add(1, attributes)

    def renewal_lag(self, *, lagging: bool, **_: Any) -> None:
        if lagging:
            self.lagging.add(1)

    def connections(self) -> list[tuple[Any, Callable[..., None]]]:
        return [
            (signals.renewal_lag, self.renewal_lag),
            (signals.lock_acquired, self.acquired),
            (signals.lock_contended, self.contended),
            (signals.lock_released, self.released),
            (signals.lock_lost, self.lost),
        ]


def install(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    metric_name: Callable[[str], str | None] | None = None,
) -> Recorder:
    """Record spans and metrics for every primitive from now on.

    The providers default to OpenTelemetry's global ones (set by your SDK
    setup). Calling it again replaces the previous recorder, so it is safe
    in ``AppConfig.ready()``, which may run more than once.
    """
    uninstall()
    recorder = Recorder(tracer_provider, meter_provider, metric_name)
    for signal, receiver in recorder.connections():
        signal.connect(receiver, weak=False, dispatch_uid=_UID)
    return recorder


def uninstall() -> None:
    """Stop recording (disconnect the receivers ``install`` connected)."""
    for signal in (
        signals.lock_acquired,
        signals.lock_contended,
        signals.lock_released,
        signals.lock_lost,
        signals.renewal_lag,
    ):
        signal.disconnect(dispatch_uid=_UID)
