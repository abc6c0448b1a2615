"""What ``@require_lock`` answers a view call that it cannot run or finish.

Three answers, each with ``Retry-After`` (``@require_slot`` answers
contention with **429 Too Many Requests** instead of 423, see ``busy``):

- **423 Locked** when the lock is held by someone else past the blocking
  timeout. ``Retry-After`` is an estimate of when this caller would get the
  lock (see :func:`retry_after`), not the holder's whole lease. Staff are
  also told who holds it and for how long (``holder_shown``).
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

Every answer names its cause in a machine-readable code, the same for a
status chosen with ``on_*``: the ``Redislock-Error`` header of every answer
and the ``code`` of the JSON ones (see ``CODES``). A client tells a lost
lock's 409 (retry) from an application's own 409 by it, not by the status
alone. Views of Django REST framework get DRF's error shape,
``{"detail": "...", "code": "..."}`` as JSON. DRF stays optional: it is
recognised only when already imported.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from http import HTTPStatus
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase, JsonResponse

from django_redislock.backend.values import holder_json, holder_phrase
from django_redislock.context import request_description
from django_redislock.exceptions import (
    LockBackendError,
    LockLostError,
    LockPoolExhausted,
    LockTimeout,
)
from django_redislock.holds.estimates import retry_after, slot_retry_after
from django_redislock.outages import OutageLog

logger = logging.getLogger(__name__)

#: ``Retry-After`` (seconds) of the 503 sent while Redis is unreachable: long
#: enough not to hammer a recovering server, short enough for a blip.
BACKEND_RETRY_AFTER = 5

#: ``Retry-After`` (seconds) of the 409 sent when a view's lock was lost: the
#: name is free again (or another holder has it), so the retry can come soon.
LOST_RETRY_AFTER = 1


#: The header that carries an answer's code, on plain and JSON answers alike.
CODE_HEADER = "Redislock-Error"
#: The codes: each answer's cause. All of them are worth retrying after
#: ``Retry-After``; ``lock_misconfigured`` only once the site is fixed.
LOCK_BUSY = "lock_busy"
SLOT_BUSY = "slot_busy"
LOCK_LOST = "lock_lost"
LOCK_SERVICE_UNAVAILABLE = "lock_service_unavailable"
LOCK_MISCONFIGURED = "lock_misconfigured"
#: A 503 whose cause is this server's own connection pool, not Redis.
LOCK_POOL_EXHAUSTED = "lock_pool_exhausted"
CODES = (
    LOCK_BUSY,
    SLOT_BUSY,
    LOCK_LOST,
    LOCK_SERVICE_UNAVAILABLE,
    LOCK_MISCONFIGURED,
    LOCK_POOL_EXHAUSTED,
)


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
        answer: Any = locked
        status = handler or HTTPStatus.LOCKED
        if self.limit is not None:
            answer = functools.partial(busy, limit=self.limit)
            status = handler or HTTPStatus.TOO_MANY_REQUESTS
        if asynchronous:  # the estimate reads Redis: not on the event loop's thread
            return sync_to_async(answer, thread_sensitive=False)(
                request, error, status, timeout=self.timeout, using=self.using
            )
        return answer(request, error, status, timeout=self.timeout, using=self.using)

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
        code = LOCK_SERVICE_UNAVAILABLE
        if isinstance(error, LockPoolExhausted):  # this server's limit, not Redis's
            message = (
                "The lock service is busy on this server (its Redis connection pool is "
                "full); try again shortly."
            )
            code = LOCK_POOL_EXHAUSTED
        return error_response(request, status, message, BACKEND_RETRY_AFTER, code)

    def misconfigured(self, request: Any, error: Exception) -> HttpResponseBase:
        """The answer to a view call whose lock cannot even be built (its
        ``using`` is not in ``CACHES``): 503, logged at ERROR, not a 500."""
        logger.error("Cannot take a lock under %s: %s; answered 503.", where_called(request), error)
        message = "The lock service is unavailable; try again shortly."
        status = HTTPStatus.SERVICE_UNAVAILABLE
        return error_response(request, status, message, BACKEND_RETRY_AFTER, LOCK_MISCONFIGURED)

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
        return error_response(request, status, message, LOST_RETRY_AFTER, LOCK_LOST)


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


def error_response(
    request: Any,
    status: int,
    message: str,
    retry_after: int,
    code: str,
    fields: dict[str, Any] | None = None,
) -> HttpResponseBase:
    """``message`` as plain text, or as ``{"detail": message, "code": code}``
    (and ``fields``) for DRF views; ``code`` in the ``Redislock-Error``
    header of both.

    The view is the one URL resolution found (``request.resolver_match``), so
    a DRF view decorated on ``dispatch`` (which sees Django's request) counts.
    """
    headers = {"Retry-After": str(retry_after), CODE_HEADER: code}
    view = getattr(getattr(request, "resolver_match", None), "func", None)
    if not is_drf(request, view):
        return HttpResponse(
            f"{message}\n", status=status, content_type="text/plain; charset=utf-8", headers=headers
        )
    requests = sys.modules["rest_framework.request"]
    body = {"detail": message, "code": code, **(fields or {})}
    if isinstance(request, requests.Request):
        # inside APIView.dispatch: a DRF Response gets the view's renderers
        response = importlib.import_module("rest_framework.response").Response
        return cast(HttpResponseBase, response(body, status=status, headers=headers))
    return JsonResponse(body, status=status, headers=headers)


def locked(
    request: Any, error: LockTimeout, status: int, *, timeout: float | None, using: str | None
) -> HttpResponseBase:
    """The answer to a view call refused ``error``: 423 (or ``status``),
    saying who holds the name to staff (``holder_shown``)."""
    seconds = retry_after(error, timeout=timeout, using=using)
    holder, held_for = error.holder, error.held_for
    busy_with, fields = "", None
    if holder is not None and holder_shown(request):
        busy_with = f" (held by {holder_phrase(holder, held_for)})"
        held = None if held_for is None else round(held_for, 1)
        fields = {"holder": holder_json(holder), "held_for": held}
    message = f"{error.name} is busy{busy_with}; try again shortly."
    return error_response(request, status, message, seconds, LOCK_BUSY, fields)


def holder_shown(request: Any) -> bool:
    """Whether a 423 may say who holds the name (host, pid, what it runs,
    for how long): only to an active staff user, who sees as much on the
    admin dashboard. Everyone else gets the answer as before, which names
    nothing but the lock; a site that wants more says so in
    ``on_contention`` with ``error.holder`` (``docs/decorators.md``)."""
    try:
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_active and user.is_staff)
    except Exception:  # a DRF request's authentication failing: not known to be staff
        return False


def busy(
    request: Any,
    error: LockTimeout,
    status: int,
    *,
    timeout: float | None,
    using: str | None,
    limit: int,
) -> HttpResponseBase:
    """The answer to a view call refused a ``require_slot`` slot: 429 (or ``status``)."""
    message = f"Too many requests for {error.name} at once; try again shortly."
    seconds = slot_retry_after(error, timeout=timeout, using=using, limit=limit)
    return error_response(request, status, message, seconds, SLOT_BUSY)


def where_called(request: Any) -> str:
    """``"POST /buy/42/"`` for the logs (a DRF request's Django request)."""
    if request is None:
        return "a function call"
    return request_description(getattr(request, "_request", request))


def log_unavailable(request: Any, error: LockBackendError, answer: str) -> None:
    """Log a view call answered without its lock: the first failure of an
    outage with its cause, then summaries (``OutageLog``)."""
    where = where_called(request)
    if isinstance(error, LockPoolExhausted):  # no outage: Redis was never asked
        logger.error("%s Under %s; answered %s.", error, where, answer, exc_info=error)
        return
    outage_log().failure(
        error,
        where,
        "Redis is unavailable for lock %r under %s; answered %s.",
        error.name,
        where,
        answer,
    )
