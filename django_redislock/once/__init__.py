"""Once: work that must not run twice, rather than not at the same time.

``@idempotent`` (``views.py``) runs a view once per ``Idempotency-Key`` and
replays its response to the repeats; enqueue-once claims (``claims.py``, with
``celery.py`` and ``django_tasks.py``) keep a second copy of a task from being
queued while one is queued or running. Imports neither Celery nor Django's
tasks: those modules are imported by the projects that use them.
"""

from __future__ import annotations

from django_redislock.once.views import idempotent

__all__ = ["idempotent"]
