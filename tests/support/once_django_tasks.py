"""Tasks of the Django tasks enqueue-once tests (Django 6.0+): each reports
that it started (``once:started``) and waits for the test's go."""

from __future__ import annotations

from django.tasks import task

from django_redislock.backend.client import get_client
from django_redislock.once.django_tasks import enqueue_once


@enqueue_once("recalc:<order_id>", lease=2)
@task
def recalc(order_id: int) -> str:
    client = get_client("default")
    client.rpush("once:started", f"recalc:{order_id}")
    assert client.blpop([f"once:go:recalc:{order_id}"], timeout=60), "never let go"
    client.incr(f"once:runs:recalc:{order_id}")
    return f"recalculated {order_id}"


@enqueue_once("mail:<user_id>")
@task
def mail(user_id: int) -> str:
    return f"mailed {user_id}"


@enqueue_once("mail:<user_id>", on_duplicate="raise")
@task
def mail_or_raise(user_id: int) -> str:
    return f"mailed {user_id}"


def enqueue_recalc(order_id: int) -> None:  # pragma: no cover (run in workers)
    """A process enqueuing ``recalc``: says what it got in ``once:enqueued``."""
    from django_redislock.once.claims import AlreadyEnqueued

    client = get_client("default")
    try:
        result = recalc.enqueue(order_id)
    except AlreadyEnqueued as exc:
        client.rpush("once:enqueued", f"refused {exc.state}")
    else:
        client.rpush("once:enqueued", f"{result.status} {result.return_value}")
