"""The Celery app of the enqueue-once tests (``docs/once.md``), run by real workers.

The broker is a database of the suite's own redis-server; each task reports
that it started (``once:started``) and waits for the test to let it finish
(``once:go:<key>``), so a test holds it running, without timing.
"""

from __future__ import annotations

import os

import django
import redis
from celery import Celery
from celery.signals import task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from django_redislock.once.celery import OnceTask  # noqa: E402 (after setup)

BROKER = os.environ["REDISLOCK_TEST_REDIS_URL"].rsplit("/", 1)[0] + "/6"
QUEUE = "redislock-once-tests"

app = Celery("once-tests", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    task_acks_late=False,
    broker_connection_retry_on_startup=True,
)


def _report() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"])


def _work(key: str) -> str:
    client = _report()
    client.rpush("once:started", key)
    assert client.blpop([f"once:go:{key}"], timeout=60), f"the test never let {key} finish"
    client.incr(f"once:runs:{key}")
    return f"done {key}"


@app.task
def ping() -> None:
    _report().rpush("once:ready", "1")


@app.task(base=OnceTask, once={"key": "recalc:<order_id>", "lease": 2})
def recalc(order_id: int) -> str:
    return _work(f"recalc:{order_id}")


@app.task(base=OnceTask, once={"key": "mail:<user_id>", "on_duplicate": "raise"})
def mail(user_id: int) -> str:
    return _work(f"mail:{user_id}")


@app.task(base=OnceTask, once={"key": "index:<doc>", "release": "start"})
def index(doc: str) -> str:
    return _work(f"index:{doc}")


@app.task(bind=True, base=OnceTask, once={"key": "flaky:<order_id>"})
def flaky(self: OnceTask, order_id: int, retry_queue: str) -> str:
    """Fails its first try and retries itself on ``retry_queue`` (where the
    test starts a worker when it is ready for the retry to run)."""
    if self.request.retries == 0:
        client = _report()
        client.rpush("once:started", f"flaky:{order_id}")
        assert client.blpop([f"once:go:flaky:{order_id}"], timeout=60), "never let go"
        raise self.retry(countdown=0, queue=retry_queue)
    return _work(f"flaky:{order_id}")


@task_postrun.connect(sender=flaky)
def _ended(task_id: str, state: str, **_: object) -> None:
    """Say that a run of ``flaky`` ended (after its claim was released, or handed on)."""
    _report().rpush("once:ended", f"flaky {task_id} {state}")
