"""What ``@require_lock`` answers a view call that it cannot run or finish.

Three answers, each with ``Retry-After`` (``@require_slot`` answers
contention with **429 Too Many Requests** instead of 423, see ``busy``):

- **423 Locked** when the lock is held by someone else past the blocking
  timeout. ``Retry-After`` is an estimate of when this caller would get the
  lock (see :func:`retry_after`), not the holder's whole lease.
- **503 Service Unavailable** when Redis cannot be reached or fails: the lock
  cannot be taken, so the view must not run (fail closed), but the client
  should retry rather than see a 500 and a traceback. The same when a lock
  taken under the view (``InventoryMixin.deduct()``, a nested ``Lock``)
  meets Redis down. Logged on ``django_redislock.responses``: the first
  failure of an outage with its cause, then a summary line per interval
  (``outages.OutageLog``).
- **409 Conflict** when the lock (the view's own or one taken under it) was
  lost while the view ran: cleared by an operator, expired, or lost with
  Redis. The work was not mutually exclusive, so the transaction the view
  ran in is rolled back, and the client is told to try again.

Views of Django REST framework get DRF's error shape, ``{"detail": "..."}``
as JSON. DRF stays optional: it is recognised only when already imported.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import sys
from http import HTTPStatus
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase, JsonResponse

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.context import request_description
from django_redislock.exceptions import LockBackendError, LockLostError, LockTimeout
from django_redislock.holds import counters
from django_redislock.outages import OutageLog

logger = logging.getLogger(__name__)

#: ``Retry-After`` (seconds) of the 503 sent while Redis is unreachable: long
#: enough not to hammer a recovering server, short enough for a blip.
BACKEND_RETRY_AFTER = 5

#: ``Retry-After`` (seconds) of the 409 sent when a view's lock was lost: the
#: name is free again (or another holder has it), so the retry can come soon.
LOST_RETRY_AFTER = 1


@functools.cache
def outage_log() -> OutageLog:
    """This process's log of lock-service outages (reset in a forked child)."""
    return OutageLog(logger)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=outage_log.cache_clear)


class Answers:
    """A view call's answers for one ``require_lock``: its ``on_contention``,
    ``on_backend_error`` and ``on_lock_lost`` (already checked), lease and
    cache alias."""

    def __init__(
        self,
        *,
        on_contention: Any,
        on_backend_error: Any,
        on_lock_lost: Any = None,
        timeout: float | None,
        using: str | None,
        limit: int | None = None,
    ) -> None:
        self.on_contention = on_contention
        self.on_backend_error = on_backend_error
        self.on_lock_lost = on_lock_lost
        self.timeout = timeout
        self.using = using
        #: ``require_slot``'s limit: refusals are 429s (``busy``); ``None``: a lock's 423s.
        self.limit = limit

    def raises(self, error: LockBackendError | LockLostError) -> bool:
        """Whether ``error``, raised under a view, is to propagate (``"raise"``)."""
        handler = self.on_lock_lost if isinstance(error, LockLostError) else self.on_backend_error
        return bool(handler == "raise")

    def failed(
        self, request: Any, error: LockBackendError | LockLostError, *, rolled_back: bool
    ) -> Any:
        """The answer to a view call under which ``error`` was raised (by the
        view, or by the release of its own lock); ``rolled_back``: the
        transaction it ran in was marked for rollback."""
        if isinstance(error, LockLostError):
            return self.lost(request, error, rolled_back=rolled_back)
        return self.unavailable(request, error)

    def contended(self, request: Any, error: LockTimeout, asynchronous: bool) -> Any:
        """The answer to a refused view call; raises ``error`` for other calls."""
        handler = self.on_contention
        if request is None or handler == "raise":
            raise error
        if callable(handler):
            return handler(request, error)
        if self.limit is not None:  # from the refusal itself: no round trip
            return busy(request, error, handler or HTTPStatus.TOO_MANY_REQUESTS, self.timeout)
        status = handler or HTTPStatus.LOCKED
        if asynchronous:  # the estimate reads Redis: not on the event loop's thread
            return sync_to_async(locked, thread_sensitive=False)(
                request, error, status, timeout=self.timeout, using=self.using
            )
        return locked(request, error, status, timeout=self.timeout, using=self.using)

    def unavailable(self, request: Any, error: LockBackendError) -> Any:
        """The answer to a view call when Redis failed; raises for other calls."""
        handler = self.on_backend_error
        if request is None or handler == "raise":
            raise error
        if callable(handler):
            log_unavailable(request, error, "with on_backend_error")
            return handler(request, error)
        status = handler or HTTPStatus.SERVICE_UNAVAILABLE
        log_unavailable(request, error, str(int(status)))
        message = "The lock service is unavailable; try again shortly."
        return error_response(request, status, message, BACKEND_RETRY_AFTER)

    def lost(self, request: Any, error: LockLostError, *, rolled_back: bool) -> Any:
        """The answer to a view call whose lock was lost while it ran."""
        handler = self.on_lock_lost
        if request is None or handler == "raise":
            raise error
        where = where_called(request)
        undone = "its transaction was rolled back" if rolled_back else "no transaction to roll back"
        if callable(handler):
            logger.warning(
                "Lock %r was lost under %s; %s; answered with on_lock_lost: %s",
                error.name,
                where,
                undone,
                error,
            )
            return handler(request, error)
        status = handler or HTTPStatus.CONFLICT
        logger.warning(
            "Lock %r was lost under %s; %s; answered %d: %s",
            error.name,
            where,
            undone,
            status,
            error,
        )
        if rolled_back:
            message = (
                f"The lock on {error.name} was lost while this request ran (it was cleared "
                "or expired), so nothing it changed was saved; try again."
            )
        else:
            message = (
                f"The lock on {error.name} was lost while this request ran (it was cleared "
                "or expired), so it did not run under the lock; try again."
            )
        return error_response(request, status, message, LOST_RETRY_AFTER)


def is_drf(request: Any, view: Any) -> bool:
    """Whether the call is a Django REST framework view's: the request is DRF's
    ``Request``, or the view is (or was made from) an ``APIView``."""
    requests = sys.modules.get("rest_framework.request")
    if requests is not None and isinstance(request, requests.Request):
        return True
    views = sys.modules.get("rest_framework.views")
    if views is None:
        return False
    view_class = getattr(view, "view_class", None)  # the function as_view() made
    return isinstance(view, views.APIView) or (
        isinstance(view_class, type) and issubclass(view_class, views.APIView)
    )


def error_response(request: Any, status: int, message: str, retry_after: int) -> HttpResponseBase:
    """``message`` as plain text, or as ``{"detail": message}`` for DRF views.

    The view is the one URL resolution found (``request.resolver_match``), so
    a DRF view decorated on ``dispatch`` (which sees Django's request) counts.
    """
    headers = {"Retry-After": str(retry_after)}
    view = getattr(getattr(request, "resolver_match", None), "func", None)
    if not is_drf(request, view):
        return HttpResponse(
            f"{message}\n", status=status, content_type="text/plain; charset=utf-8", headers=headers
        )
    requests = sys.modules["rest_framework.request"]
    if isinstance(request, requests.Request):
        # inside APIView.dispatch: a DRF Response gets the view's renderers
        response = importlib.import_module("rest_framework.response").Response
        return cast(HttpResponseBase, response({"detail": message}, status=status, headers=headers))
    return JsonResponse({"detail": message}, status=status, headers=headers)


def locked(
    request: Any, error: LockTimeout, status: int, *, timeout: float | None, using: str | None
) -> HttpResponseBase:
    """The answer to a view call refused ``error``: 423 (or ``status``)."""
    seconds = retry_after(error, timeout=timeout, using=using)
    return error_response(request, status, f"{error.name} is busy; try again shortly.", seconds)


def busy(request: Any, error: LockTimeout, status: int, timeout: float | None) -> HttpResponseBase:
    """The answer to a view call refused a ``require_slot`` slot: 429 (or ``status``)."""
    message = f"Too many requests for {error.name} at once; try again shortly."
    return error_response(request, status, message, slot_retry_after(error, timeout=timeout))


def slot_retry_after(error: LockTimeout, *, timeout: float | None) -> int:
    """Seconds until a caller refused a slot of ``error.name`` would likely get one.

    The semaphore's own hint, read from the Redis server's clock in the
    refusing script: when the earliest-ending permit's lease runs out (or,
    with waiters entitled to a slot that just freed, how soon they take it).
    A holder that finishes frees its slot sooner, so this errs long, never
    short, as a ``Retry-After`` should; rounded up, at least 1. Without a
    hint it is the lease (``timeout``, else ``REDISLOCK['TIMEOUT']``).
    """
    seconds = error.retry_after
    if not seconds:
        seconds = timeout if timeout is not None else get_settings().timeout
    return max(1, math.ceil(seconds))


def retry_after(error: LockTimeout, *, timeout: float | None, using: str | None) -> int:
    """Seconds until a caller refused ``error.name`` would likely get it.

    From the name's counters (``REDISLOCK['STATS']``): past acquirers that
    waited in line and got the lock waited ``wait_ms / waited`` on average,
    about one hold each; this caller would wait for the current hold and for
    each waiter queued now, so the estimate is that average times (queued +
    1). Refused calls are left out of the average: they add to
    ``contended`` but not to ``wait_ms``, so dividing by ``contended`` made
    the estimate shrink with every 423, the busier the name the sooner.
    It is capped by the holder's remaining lease (or the lock's lease when
    that is unknown), and is at least 1. With no history (counters off, or
    the first contention of the name) it is the holder's remaining lease.
    """
    settings = get_settings()
    cap = error.retry_after or (timeout if timeout is not None else settings.timeout)
    name = error.name
    if name is not None and settings.stats:
        try:
            average, queued = _history(name, using)
        except (LockBackendError, *backend.BACKEND_ERRORS):  # the 423 stands without it
            average, queued = None, 0
        if average is not None:
            estimate = average * (queued + 1)
            cap = min(estimate, cap) if cap else estimate
    return max(1, math.ceil(cap)) if cap else 1


def _history(name: str, using: str | None) -> tuple[float | None, int]:
    """The average wait in seconds of an acquire that waited and got the
    lock (``None`` when never waited for) and the number of waiters queued
    now: one round trip.

    ``wait_ms`` and ``waited`` are written batched (``holds/counters.py``): this
    process's own waits not written yet are added from its tally, other
    processes' may be up to a second behind. A counters hash written before
    ``waited`` was counted has only ``contended`` to divide by.
    """
    settings = get_settings()
    alias = using or settings.cache
    client, prefix = backend.get_client(alias), backend.namespace(alias, settings.key_prefix)
    stats_key = backend.key(prefix, name, "stats")
    pipe = client.pipeline(transaction=False)
    pipe.hmget(stats_key, ["waited", "wait_ms", "contended"])
    pipe.zcard(backend.key(prefix, name, "queue"))
    (waited, wait_ms, contended), queued = pipe.execute()
    _, own_wait_ms, own_waited = counters.pending(client, stats_key.encode())
    wait_ms = int(wait_ms or 0) + own_wait_ms
    waits = int(waited or 0) + own_waited or int(contended or 0)
    if not waits or not wait_ms:
        return None, int(queued)
    return wait_ms / waits / 1000.0, int(queued)


def where_called(request: Any) -> str:
    """``"POST /buy/42/"`` for the logs (a DRF request's Django request)."""
    if request is None:
        return "a function call"
    return request_description(getattr(request, "_request", request))


def log_unavailable(request: Any, error: LockBackendError, answer: str) -> None:
    """Log a view call answered without its lock: the first failure of an
    outage with its cause, then summaries (``OutageLog``)."""
    where = where_called(request)
    outage_log().failure(
        error,
        where,
        "Redis is unavailable for lock %r under %s; answered %s.",
        error.name,
        where,
        answer,
    )
