"""The Prometheus recipe of docs/metrics.md, run as written against real Redis."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from django_redislock import Lock, LockLostError, Semaphore, signals  # noqa: E402
from tests.support.signals_helper import time_out_in_another_thread  # noqa: E402


@contextmanager
def capture(signal: Any) -> Iterator[list[dict[str, Any]]]:
    """Record every send of ``signal`` and the thread it ran in."""
    calls: list[dict[str, Any]] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        calls.append({"thread": threading.current_thread(), **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)


DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _recipe() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    [recipe] = [block for block in blocks if "prometheus_client" in block]
    return str(recipe)


@pytest.fixture
def recipe() -> Iterator[dict[str, Any]]:
    namespace: dict[str, Any] = {}
    exec(compile(_recipe(), str(DOC), "exec"), namespace)
    try:
        yield namespace
    finally:
        for signal in (
            signals.lock_acquired,
            signals.lock_contended,
            signals.lock_released,
            signals.lock_lost,
        ):
            signal.disconnect(dispatch_uid="lock_metrics")
        for metric in ("WAIT", "HOLD", "TIMEOUTS", "LOST"):
            prometheus_client.REGISTRY.unregister(namespace[metric])


def sample(name: str, **labels: str) -> float | None:
    value = prometheus_client.REGISTRY.get_sample_value(name, labels)
    return None if value is None else float(value)


def test_the_recipe_counts_holds_waits_and_timeouts(recipe: dict[str, Any]) -> None:
    with Lock("recipe:a"):
        pass
    assert sample("redislock_hold_seconds_count", kind="lock") == 1
    assert sample("redislock_wait_seconds_count", kind="lock", outcome="acquired") == 1

    time_out_in_another_thread("recipe:busy", 0.2)
    assert sample("redislock_timeouts_total", kind="lock") == 1
    waited = sample("redislock_wait_seconds_sum", kind="lock", outcome="timeout")
    assert waited is not None and waited >= 0.15


def test_the_recipe_counts_lost_leases_and_labels_each_kind(recipe: dict[str, Any]) -> None:
    lock = Lock("recipe:lost", timeout=0.1, auto_renew=False)
    lock.acquire()
    time.sleep(0.3)  # the lease runs out, unrenewed: the release finds it gone
    with capture(signals.lock_lost) as lost, pytest.raises(LockLostError):
        lock.release()
    assert sample("redislock_lost_leases_total", kind="lock") == 1
    assert [call["thread"] for call in lost] == [threading.current_thread()]  # as the page says

    with Semaphore("recipe:pool", 2):
        pass
    assert sample("redislock_hold_seconds_count", kind="semaphore") == 1
