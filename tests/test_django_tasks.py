"""The Django tasks recipes of ``docs/celery.md``: ``@task`` above
``@require_lock``, run by the immediate backend in real OS processes (the lock
does not care which process runs the task: a worker's, or the one enqueuing)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("django.tasks")
pytestmark = pytest.mark.usefixtures("real_redis")

from django_redislock import Lock  # noqa: E402
from tests.support.gauge import Gauge  # noqa: E402
from tests.support.other_holders import OtherThread  # noqa: E402
from tests.support.procs import CTX, processes  # noqa: E402


def enqueue_imports(gauge: Gauge, start: Any, feed: str, count: int) -> None:  # pragma: no cover
    from tests.support import django_tasks

    django_tasks.GAUGE = gauge
    start.wait(60)  # all set up: enqueue at once
    for _ in range(count):
        result = django_tasks.import_feed.enqueue(feed)
        assert result.status == "SUCCESSFUL", result.errors
        assert result.return_value == f"imported {feed}"


def test_one_task_per_name_at_a_time_across_processes() -> None:
    gauge, start = Gauge(), CTX.Barrier(3)
    with processes(enqueue_imports, [(gauge, start, "prices", 4)] * 3):
        pass
    assert gauge.entries == 12
    assert gauge.peak == 1


def test_skip_when_already_running(other_thread: OtherThread) -> None:
    from tests.support import django_tasks

    held = Lock("report:monday")
    assert other_thread(held.acquire)
    try:
        result: Any = django_tasks.nightly_report.enqueue("monday")
        assert result.status == "SUCCESSFUL" and result.return_value == "skipped"
    finally:
        other_thread(held.release)
    result = django_tasks.nightly_report.enqueue("monday")
    assert result.return_value == "report for monday"


def test_a_holder_enqueuing_with_the_immediate_backend_runs_instead_of_skipping() -> None:
    """As the page says: the immediate backend runs the task in the enqueuing
    thread, which already holds ``report:<day>``, and the lock is reentrant."""
    from tests.support import django_tasks

    with Lock("report:friday"):
        result: Any = django_tasks.nightly_report.enqueue("friday")
    assert result.return_value == "report for friday"
