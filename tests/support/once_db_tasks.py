"""Tasks of the enqueue-once tests with a real worker (Django 6.0+ and
django-tasks-db): enqueued on its database backend (``TASKS["db"]`` in
``tests/settings.py``) and run by ``manage.py db_worker`` in another process.

Each task reports that it started (``once:started``) and waits for the test's
go (``once:go:<key>``), so a test holds it running without timing.
"""

from __future__ import annotations

from django.tasks import task

from django_redislock.backend.client import get_client
from django_redislock.once.django_tasks import enqueue_once


def _work(key: str) -> str:
    client = get_client("default")
    client.rpush("once:started", key)
    assert client.blpop([f"once:go:{key}"], timeout=60), f"the test never let {key} finish"
    client.incr(f"once:runs:{key}")
    return f"done {key}"


@enqueue_once("recalc:<order_id>", lease=2)
@task(backend="db")
def recalc(order_id: int) -> str:
    return _work(f"recalc:{order_id}")


@enqueue_once("index:<doc>", release="start")
@task(backend="db")
def index(doc: str) -> str:
    return _work(f"index:{doc}")


@enqueue_once("charge:<order_id>")
@task(backend="db")
def charge(order_id: int) -> str:
    get_client("default").rpush("once:started", f"charge:{order_id}")
    raise ValueError(f"card declined for order {order_id}")


def run_worker() -> None:  # pragma: no cover (run in a worker process)
    """``manage.py db_worker`` on the ``db`` backend, one task at a time."""
    from django.core.management import call_command

    get_client("default").rpush("once:worker", "up")
    call_command(
        "db_worker", "--backend", "db", "--interval", "0.1", "--no-startup-delay", "--no-reload"
    )


def enqueue_at_once(order_id: int) -> None:  # pragma: no cover (run in enqueuing processes)
    """Say it is ready (``once:ready``), wait for the test's fire
    (``once:fire``) so that every process enqueues at the same moment, and
    say what it got (``once:enqueued``): the result's id, or refused."""
    from django_redislock.once.claims import AlreadyEnqueued

    client = get_client("default")
    client.rpush("once:ready", "1")
    assert client.blpop(["once:fire"], timeout=60), "never fired"
    try:
        result = recalc.enqueue(order_id)
    except AlreadyEnqueued as exc:
        client.rpush("once:enqueued", f"refused {exc.state} {exc.task_id}")
    else:
        client.rpush("once:enqueued", f"result {result.id}")
