"""Enqueue once with Celery: ``@shared_task(base=OnceTask, once={...})``.

``apply_async`` (and so ``delay``) claims the task's key first (``claims.py``):
a second enqueue while one is queued or running returns the first's
``AsyncResult`` (``on_duplicate="coalesce"``) or raises ``AlreadyEnqueued``.
The run (``__call__``, which Celery's worker calls for a task that defines
it) takes the claim over, renews it while the task runs, and releases it when
the task ends, or as it starts with ``release="start"``. A retry the task
sends of itself (``self.retry()``) takes the claim over, queued again, so
that the retry still counts as the one enqueued. Imported by projects that
use Celery only; the package never imports it.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from celery import Task
from celery.utils import uuid

from django_redislock.exceptions import LockBackendError
from django_redislock.once.claims import AlreadyEnqueued, Claims, Once, Run

logger = logging.getLogger(__name__)

#: Where the running task's hold on its claim waits for a retry (on its request).
RUN_ATTRIBUTE = "redislock_once_run"


class OnceTask(Task):  # type: ignore[misc]  # Celery ships no types
    """A Celery task enqueued at most once per key at a time.

    ``once`` is a dict of ``Once``'s fields: ``key`` (the template, filled from
    the task's arguments: ``"recalc:<order_id>"``), ``release`` (``"end"`` or
    ``"start"``), ``on_duplicate`` (``"coalesce"`` or ``"raise"``), ``lease``
    (seconds a running task's claim outlives its worker, renewed while it
    runs), ``queued_ttl`` (seconds a claim lasts if its task never starts)
    and ``using``. Checked when Celery creates the task.
    """

    once: Any = None

    def __init__(self) -> None:
        if type(self) is not OnceTask:  # a task made from a function: check it now
            _ = self._claims

    @cached_property
    def _claims(self) -> Claims:
        if self.once is None:
            raise TypeError(f"{self.name}: OnceTask needs once={{'key': ...}}.")
        return Claims(Once.of(self.once), self.run, "OnceTask")

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Enqueue unless a task with this key is queued or running; a retry
        the running task sends of itself (``self.retry()``) keeps its claim."""
        claims = self._claims
        name = claims.name(args or (), kwargs or {})
        task_id = task_id or uuid()
        token = secrets.token_hex(16)
        if not self._requeued(name, task_id, token, options):
            existing = claims.claim(name, token, task_id, self.name)
            if existing is not None and existing.task_id != task_id:  # not its own retry
                if claims.once.on_duplicate == "raise" or existing.task_id is None:
                    raise AlreadyEnqueued(name, existing.task_id, existing.state)
                return self.AsyncResult(existing.task_id)
        try:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        except BaseException:
            claims.release(name, "token", token)  # nothing queued: nothing claimed
            raise

    def _requeued(self, name: str, task_id: str, token: str, options: dict[str, Any]) -> bool:
        """Whether this send is the running task's retry of itself, its claim
        handed over to it (queued again: a duplicate enqueued while the retry
        waits gets its ``AsyncResult``). A Redis failure is logged and the
        retry sent all the same: the task was dequeued once already."""
        run = getattr(self.request, RUN_ATTRIBUTE, None)
        if not isinstance(run, Run) or run.task_id != task_id or run.name != name:
            return False
        try:
            if not run.requeue(token, _delay(options)):
                return False  # cleared or lapsed: claimed afresh, like any enqueue
        except LockBackendError as exc:
            logger.warning("Could not keep the claim %r for the retry: %s", name, exc)
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        claims = self._claims
        name = claims.name(args, kwargs)
        with claims.running(name, self.request.id or "", self.name) as run:
            setattr(self.request, RUN_ATTRIBUTE, run)  # for a retry (_requeued)
            return super().__call__(*args, **kwargs)


def _delay(options: dict[str, Any]) -> float:
    """Seconds until a retry sent with these options may start."""
    if options.get("countdown"):
        return float(options["countdown"])
    eta = options.get("eta")
    if isinstance(eta, datetime):
        now = datetime.now(eta.tzinfo or timezone.utc)  # a naive eta is UTC, as Celery has it
        return (eta.replace(tzinfo=eta.tzinfo or timezone.utc) - now).total_seconds()
    return 0.0
