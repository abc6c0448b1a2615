"""The Celery app of the Celery recipe tests (``docs/celery.md``), run by a real worker.

The broker is a Redis database of the suite's own redis-server; the tasks
report what they did in Redis lists the test reads with ``BLPOP``.
"""

from __future__ import annotations

import math
import os
import time

import django
import redis
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from django_redislock import LockTimeout, require_lock  # noqa: E402 (after setup)

BROKER = os.environ["REDISLOCK_TEST_REDIS_URL"].rsplit("/", 1)[0] + "/5"

app = Celery("tests", broker=BROKER)
app.conf.update(
    task_default_queue="redislock-tests",
    worker_prefetch_multiplier=1,
    task_acks_late=False,
    broker_connection_retry_on_startup=True,
)


def _report() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"])


@app.task
def ping() -> None:
    _report().rpush("celery:ready", "1")


# One task per name at a time, across workers: a lock named after the work.
@app.task
@require_lock("import:<feed>", blocking_timeout=30)
def import_feed(feed: str) -> None:
    client = _report()
    running = client.incr(f"celery:running:{feed}")
    client.rpush(f"celery:concurrency:{feed}", running)
    time.sleep(0.2)  # the work
    client.decr(f"celery:running:{feed}")
    client.rpush("celery:done", feed)


# Skip when already running, as celery-once does.
@app.task
def report_once(day: str) -> str:
    try:
        return _build_report(day)
    except LockTimeout:
        _report().rpush("celery:done", f"skipped {day}")
        return "skipped"


@require_lock("report:<day>", blocking_timeout=0)
def _build_report(day: str) -> str:
    _report().rpush("celery:done", f"built {day}")
    return "built"


# Or retry later, when the holder's lease says it will be free.
@app.task(bind=True, max_retries=5)
def report_later(self: object, day: str) -> str:
    try:
        return _build_report(day)
    except LockTimeout as exc:
        countdown = math.ceil(exc.retry_after or 1)
        _report().rpush("celery:done", f"retry {day} in {countdown}")
        raise self.retry(countdown=countdown, exc=exc) from exc  # type: ignore[attr-defined]


# A hold handed from a view to a task (docs/long-holds.md): the task adopts
# the ticket, shortens the lease so that only its own watchdog keeps it past
# a few leases, reports what it saw, and releases at the block's end.
@app.task
def export_handed_over(ticket: str) -> None:
    import json

    from django_redislock import Lock, LockLostError

    client = _report()
    try:
        with Lock.adopt(ticket) as lock:
            lock.extend(0.5)
            time.sleep(2.0)  # the work: four leases, renewed by this worker
            report = {"pid": os.getpid(), "fence": lock.fencing_token, "owned": lock.owned()}
    except LockLostError as exc:
        report = {"lost": str(exc)}
    report["released"] = not client.exists("redislock:{export:handed}:lock")
    client.rpush("celery:handed", json.dumps(report))
