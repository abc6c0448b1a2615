"""``LockErrorMiddleware``: a lock failure that escapes a view answers 409 or 503, never a 500.

``@require_lock`` answers the lock failures raised inside the view it guards.
One escapes it: under ``ATOMIC_REQUESTS`` Django commits the view's transaction
after the view has returned, outside the decorator, and a hold handed to that
transaction whose lease was lost meanwhile makes the commit raise
``LockLostError`` (rolling the transaction back) where no decorator sees it.
Such an error, and a lock failure from a view with no decorator, reaches this
middleware's ``process_exception`` and gets the answer the decorator would
have given: ``LockLostError`` a ``409 Conflict``, ``LockBackendError`` a ``503``,
each with ``Retry-After``, logged the same way (an outage once, then
summarised). Add it to ``MIDDLEWARE`` (anywhere: Django calls
``process_exception`` of every middleware for an exception the view raised);
system check ``W004`` reminds a site with ``ATOMIC_REQUESTS`` that lacks it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.db import connections
from django.http import HttpRequest, HttpResponseBase

from django_redislock import responses
from django_redislock.exceptions import LockBackendError, LockLostError

#: The answers of a ``@require_lock`` with every option left at its default.
_DEFAULTS = responses.Answers(on_contention=None, on_backend_error=None, timeout=None, using=None)


def _rolled_back(request: HttpRequest) -> bool:
    """Whether Django ran the view in a transaction (``ATOMIC_REQUESTS``, the
    view not marked ``non_atomic_requests``) that the exception rolled back."""
    match = getattr(request, "resolver_match", None)
    func = getattr(match, "func", None)
    skipped: set[str] = getattr(func, "_non_atomic_requests", set())
    return any(
        connection.settings_dict.get("ATOMIC_REQUESTS") and connection.alias not in skipped
        for connection in connections.all(initialized_only=True)
    )


class LockErrorMiddleware:
    """Answer ``LockLostError`` and ``LockBackendError`` from a view as ``@require_lock`` does."""

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response = get_response
        self.asynchronous = iscoroutinefunction(get_response)
        if self.asynchronous:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.asynchronous:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await self.get_response(request)  # type: ignore[misc]

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        """The answer to a lock failure the view raised; ``None`` for any other error."""
        if isinstance(exception, LockLostError):
            rolled_back = exception.rolled_back or _rolled_back(request)
            return _DEFAULTS.lost(request, exception, rolled_back=rolled_back)
        if isinstance(exception, LockBackendError):
            return _DEFAULTS.unavailable(request, exception)
        return None
