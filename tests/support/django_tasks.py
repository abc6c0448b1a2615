"""The Django tasks recipes of ``docs/celery.md`` (Django 6.0+), as written
there; the task bodies report to the test through ``GAUGE``."""

from __future__ import annotations

from django.tasks import task

from django_redislock import LockTimeout, require_lock
from tests.support.gauge import Gauge

#: Set by a test's worker process before it enqueues.
GAUGE: Gauge | None = None


def work() -> None:
    import time

    assert GAUGE is not None
    with GAUGE.inside():
        time.sleep(0.05)  # long enough that an unlocked run would overlap


@task
@require_lock("import:<feed>", blocking_timeout=30)  # waits its turn, fairly
def import_feed(feed: str) -> str:
    work()
    return f"imported {feed}"


@task
def nightly_report(day: str) -> str:
    try:
        return build_report(day)
    except LockTimeout:
        return "skipped"  # another worker is building it


@require_lock("report:<day>", blocking_timeout=0)
def build_report(day: str) -> str:
    return f"report for {day}"
