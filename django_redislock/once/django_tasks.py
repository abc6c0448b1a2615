"""Enqueue once with Django's tasks framework (Django 6.0+): ``@enqueue_once``
above ``@task``.

The task it returns claims its key in ``enqueue`` (``claims.py``): a second
enqueue while one is queued or running gets the first's ``TaskResult``
(``task.get_result(id)``, for backends that keep results), or
``AlreadyEnqueued`` (``on_duplicate="raise"``, a backend that cannot give
the result: the immediate backend, or a first enqueue whose id the backend has
not given yet). Its run (``call``, which backends call)
takes the claim over, renews it while it runs and releases it when it ends, or
as it starts with ``release="start"``. Imported by projects that use
``django.tasks`` only; the package never imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks import Task, TaskResult
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError as error:  # Django before 6.0 has no tasks framework
    raise ImproperlyConfigured(
        "django_redislock.once.django_tasks needs Django 6.0 or later (django.tasks); "
        "on older Django, use django_redislock.once.celery or @idempotent"
    ) from error

from django_redislock.exceptions import LockBackendError
from django_redislock.once.claims import AlreadyEnqueued, Claims, Existing, Once

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # generic in django-stubs only
    _Task = Task[Any, Any]
else:
    _Task = Task


def enqueue_once(
    key: str,
    *,
    release: str = "end",
    on_duplicate: str = "coalesce",
    lease: float = 30.0,
    queued_ttl: float = 3600.0,
    using: str | None = None,
) -> Callable[[Task[Any, Any]], OnceTask]:
    """Enqueue the task below at most once per ``key`` at a time.

    ``key`` is a template filled from the task's arguments (``"recalc:<order_id>"``);
    ``release``: ``"end"`` (when the task ends) or ``"start"`` (as it starts);
    ``on_duplicate``: ``"coalesce"`` or ``"raise"``; ``lease``: seconds a
    running task's claim outlives its worker (renewed while it runs);
    ``queued_ttl``: seconds a claim lasts if its task never starts; ``using``:
    the cache alias. Checked here, as the task is defined.
    """
    once = Once(key, release, on_duplicate, lease, queued_ttl, using)  # type: ignore[arg-type]

    def decorator(task: Task[Any, Any]) -> OnceTask:
        if not isinstance(task, Task):
            raise TypeError(f"enqueue_once goes above @task, on a Task, not on {task!r}.")
        if iscoroutinefunction(task.func):
            raise TypeError(f"enqueue_once: {task.name} is async; only sync tasks are supported.")
        Claims(once, task.func, "enqueue_once")  # the template against the signature
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
        return OnceTask(**fields, once=once)

    return decorator


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OnceTask(_Task):
    """A ``Task`` enqueued at most once per key at a time (``enqueue_once``)."""

    once: Once

    def _claims(self) -> Claims:
        return Claims(self.once, self.func, "enqueue_once")

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskResult[Any, Any]:
        claims = self._claims()
        name = claims.name(args, kwargs)
        token = secrets.token_hex(16)
        existing = claims.claim(name, token, "", self.name)
        if existing is not None:
            return self._existing(name, existing)
        try:
            result = Task.enqueue(self, *args, **kwargs)
        except BaseException:
            claims.release(name, "token", token)  # nothing queued: nothing claimed
            raise
        try:
            claims.bind(name, token, result.id)
        except LockBackendError as exc:  # queued and claimed: only its id is unknown
            logger.warning("Could not record the id of %s under %r: %s", self.name, name, exc)
        return result

    def _existing(self, name: str, existing: Existing) -> TaskResult[Any, Any]:
        if self.once.on_duplicate == "raise" or existing.task_id is None:
            raise AlreadyEnqueued(name, existing.task_id, existing.state)
        try:
            return self.get_result(existing.task_id)
        except (NotImplementedError, TaskResultDoesNotExist) as exc:
            raise AlreadyEnqueued(name, existing.task_id, existing.state) from exc

    def call(self, *args: Any, **kwargs: Any) -> Any:
        claims = self._claims()
        name = claims.name(args, kwargs)
        with claims.running(name, "", self.name):
            return Task.call(self, *args, **kwargs)
