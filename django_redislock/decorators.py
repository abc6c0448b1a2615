"""``@require_lock``: run a view, task or function under a lock named from its arguments.

``"sku:<pk>"`` names the lock from the call (``naming.py``: the call's
arguments, the view's URL kwargs, attributes; checked when the decorator is
applied, so a placeholder that no argument can ever fill is an
``ImproperlyConfigured`` at import time, not a 500 per request).

A call is a *view call* when its first argument (or its second, after ``self``)
is an ``HttpRequest``. Then contention answers ``423 Locked`` with
``Retry-After``, and a name that cannot be used as a lock name (see
``base.check_name``: empty, longer than 1024 characters, control characters;
or a placeholder that is ``None``) is a ``BadRequest`` (400). Any other call
raises ``LockTimeout`` and ``ValueError`` instead.

A view call never turns a lock failure into a 500: Redis unreachable, for
the view's own lock or any lock taken under it (``LockBackendError``), is a
``503`` (``on_backend_error``); a lock lost while the view ran
(``LockLostError``: cleared by an operator, expired) is a ``409 Conflict``
(``on_lock_lost``), with the transaction the view ran in rolled back.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import BadRequest
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponseBase

from django_redislock import responses
from django_redislock.context import describing_request
from django_redislock.exceptions import LockBackendError, LockLostError, LockTimeout
from django_redislock.naming import NamePlan, parse_template
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.lock import Lock
from django_redislock.transactions import hand_over
from django_redislock.validation import check_alias, check_lease, check_seconds

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

ContentionHandler = Callable[
    [HttpRequest, LockTimeout], HttpResponseBase | Awaitable[HttpResponseBase]
]
OnContention = int | ContentionHandler | Literal["raise"] | None
BackendErrorHandler = Callable[
    [HttpRequest, LockBackendError], HttpResponseBase | Awaitable[HttpResponseBase]
]
OnBackendError = int | BackendErrorHandler | Literal["raise"] | None
LockLostHandler = Callable[
    [HttpRequest, LockLostError], HttpResponseBase | Awaitable[HttpResponseBase]
]
OnLockLost = int | LockLostHandler | Literal["raise"] | None

#: Lock failures raised under a view call that it answers instead of a 500.
_ANSWERED = (LockBackendError, LockLostError)


def _check_on_contention(value: object, option: str = "on_contention") -> Any:
    if value is None or value == "raise" or callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f'{option} must be an HTTP status (int), a callable or "raise", not {value!r}.'
        )
    if not 400 <= value <= 599:
        raise ValueError(f"{option} status must be an error status (400-599), not {value}.")
    return value


def _release_failed(name: str, exc: LockBackendError, request: Any) -> None:
    """Redis failed while releasing after the function ran: its lease frees the
    lock (the watchdog stopped renewing it). Logged, not raised into a view's
    answer: a 500 (or a 503) would invite a retry of work that is done. Part
    of an outage: logged once, then summarised (``outages.OutageLog``)."""
    where = responses.where_called(request)
    responses.outage_log().failure(
        exc,
        f"{where} (release)",
        "Could not release %r after the call under %s; its lease will free it: %s",
        name,
        where,
        exc,
    )


def _roll_back() -> bool:
    """Mark the transactions a view call ran in for rollback, as its exception
    would have done had it reached them: their ``atomic()`` rolls back instead
    of committing a response that says the work failed. Whether there was one.
    (A connection in autocommit-off mode outside ``atomic()`` is its owner's
    to roll back; async views run in none.)"""
    marked = False
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            transaction.set_rollback(True, using=connection.alias)
            marked = True
    return marked


def _release_or_hold_until_commit(lock: Lock) -> None:
    """Release now, or when the enclosing database transaction ends.

    Under ``ATOMIC_REQUESTS`` (or any outer ``atomic()``) the function's writes
    commit after it returns. Releasing at the return would let the next holder
    read the row before those writes are visible and overwrite them: the lost
    update the lock is there to prevent. So the thread's outermost hold is
    handed to the transaction, which releases it after its commit or rollback.
    """
    if not hand_over(lock):
        lock.__exit__(None, None, None)


def require_lock(
    template: str,
    *,
    timeout: float | None = None,
    blocking_timeout: float | None = None,
    on_contention: OnContention = None,
    on_backend_error: OnBackendError = None,
    on_lock_lost: OnLockLost = None,
    using: str | None = None,
) -> Callable[[F], F]:
    """Run the decorated view or function only while holding the lock ``template`` names.

    ``timeout``, ``blocking_timeout`` and ``using`` mean what they mean for
    ``Lock`` (defaults from ``REDISLOCK``). ``on_contention`` shapes a view's
    answer when the lock cannot be had in time: ``None`` for ``423 Locked``,
    another error status, a callable ``(request, LockTimeout) -> response``
    (sync or async), or ``"raise"`` to let ``LockTimeout`` propagate. Calls
    that are not view calls always raise ``LockTimeout``.

    ``on_backend_error`` does the same when Redis cannot be reached or fails
    (``LockBackendError``) while taking the lock (the view does not run) or
    under the view (a nested ``Lock``, ``InventoryMixin.deduct()``): ``None``
    for ``503 Service Unavailable`` with ``Retry-After``, another error
    status, a callable ``(request, LockBackendError) -> response``, or
    ``"raise"``. The cause is logged at ERROR unless it is raised, once per
    outage, then summarised.

    ``on_lock_lost`` does the same when a lock was lost while the view ran
    (``LockLostError`` from the view or from leaving its own lock: cleared by
    ``locks clear``, expired, lost with Redis): ``None`` for ``409 Conflict``
    with ``Retry-After``, another error status, a callable ``(request,
    LockLostError) -> response``, or ``"raise"``. Unless it is raised, the
    transactions the view ran in (``ATOMIC_REQUESTS``, an ``atomic()``
    around it) are rolled back as the exception would have done.

    Answers are built by ``responses`` (DRF views get ``{"detail": ...}``
    JSON). Calls that are not view calls raise these errors.
    """
    parts = parse_template(template)
    check_lease(timeout)
    check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    check_alias(using)
    answers = responses.Answers(
        on_contention=_check_on_contention(on_contention),
        on_backend_error=_check_on_contention(on_backend_error, "on_backend_error"),
        on_lock_lost=_check_on_contention(on_lock_lost, "on_lock_lost"),
        timeout=timeout,
        using=using,
    )

    def decorator(func: F) -> F:
        plan = NamePlan(func, parts)
        return _wrap(func, _Guard(func, template, plan, answers, (timeout, blocking_timeout)))

    return decorator


def _wrap(func: F, guard: _Guard) -> F:
    """``func`` run through ``guard``, sync or async as ``func`` is."""
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        qualname = getattr(func, "__qualname__", repr(func))
        raise TypeError(
            f"require_lock cannot guard {qualname}(), a generator function: its body "
            f"runs after the call has returned, and the lock was released by then. "
            f"Take the lock inside it: `with Lock(...):` (`async with AsyncLock(...):`)."
        )
    if iscoroutinefunction(func):

        async def _async_view(*args: Any, **kwargs: Any) -> Any:
            return await guard.call_async(*args, **kwargs)

        return cast(F, markcoroutinefunction(functools.wraps(func)(_async_view)))

    def _view(*args: Any, **kwargs: Any) -> Any:
        return guard.call(*args, **kwargs)

    return cast(F, functools.wraps(func)(_view))


class _Guard:
    """One decorated callable: names its lock per call, takes it, answers
    contention and backend errors, runs the callable and releases. The sync
    and async calls are twins that share everything but the awaits."""

    def __init__(
        self,
        func: Callable[..., Any],
        template: str,
        plan: NamePlan,
        answers: responses.Answers,
        options: tuple[float | None, float | None],
    ) -> None:
        self.func = func
        self.template = template
        self.plan = plan
        self.answers = answers
        self.timeout, self.blocking_timeout = options
        self.contended = functools.partial(
            answers.contended, asynchronous=iscoroutinefunction(func)
        )

    def lock_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        request = self.plan.request_of(args)
        try:
            return self.plan.name(request, args, kwargs), request
        except ValueError as exc:
            if request is None:
                raise
            raise BadRequest(f"Cannot lock {self.template!r}: {exc}") from exc

    def call(self, *args: Any, **kwargs: Any) -> Any:
        name, request = self.lock_name(args, kwargs)
        # the holder is the thread: a nested call for the same name re-enters
        lock = Lock(
            name,
            timeout=self.timeout,
            blocking_timeout=self.blocking_timeout,
            using=self.answers.using,
        )
        try:
            with describing_request(request):
                acquired = lock._acquire(None, None)
        except LockBackendError as exc:
            return self.answers.unavailable(request, exc)
        responses.outage_log().answered()
        if not acquired.held:
            return self.contended(request, lock._timeout_error(acquired))
        try:
            result = self.func(*args, **kwargs)
        except _ANSWERED as exc:
            if request is None or self.answers.raises(exc):
                self._leave_raised(lock, name, exc, request)
                raise
            try:  # answered (and logged) first: a release failing too is the same outage
                return self.answers.failed(request, exc, rolled_back=_roll_back())
            finally:
                self._leave_raised(lock, name, exc, request)
        except BaseException as exc:
            self._leave_raised(lock, name, exc, request)
            raise
        try:
            _release_or_hold_until_commit(lock)
        except LockLostError as exc:
            if request is None or self.answers.raises(exc):
                raise
            return self.answers.lost(request, exc, rolled_back=_roll_back())
        except LockBackendError as exc:
            if request is None:
                raise
            _release_failed(name, exc, request)  # the view's work is done: answer it
        return result

    def _leave_raised(self, lock: Lock, name: str, exc: BaseException, request: Any) -> None:
        """Leave the lock after the function raised ``exc``, which goes on."""
        try:
            # in a transaction its writes may still commit (a caller that
            # catches the error): held until it ends, as after a return
            if not hand_over(lock, confirm=False):
                lock.__exit__(type(exc), exc, exc.__traceback__)
        except LockBackendError as release_exc:
            _release_failed(name, release_exc, request)  # the original error goes on

    async def call_async(self, *args: Any, **kwargs: Any) -> Any:
        name, request = self.lock_name(args, kwargs)
        # the holder is the task: a nested call for the same name re-enters
        lock = AsyncLock(
            name,
            timeout=self.timeout,
            blocking_timeout=self.blocking_timeout,
            using=self.answers.using,
        )
        try:
            with describing_request(request):
                acquired = await lock._acquire(None, None)
        except LockBackendError as exc:
            return await _answered(self.answers.unavailable(request, exc))
        responses.outage_log().answered()
        if not acquired.held:
            return await _answered(self.contended(request, lock._timeout_error(acquired)))
        try:
            result = await self.func(*args, **kwargs)
        except _ANSWERED as exc:
            if request is None or self.answers.raises(exc):
                await self._leave_raised_async(lock, name, exc, request)
                raise
            try:  # an async view runs in no transaction of its thread's: none to roll back
                return await _answered(self.answers.failed(request, exc, rolled_back=False))
            finally:
                await self._leave_raised_async(lock, name, exc, request)
        except BaseException as exc:
            await self._leave_raised_async(lock, name, exc, request)
            raise
        try:
            await lock.__aexit__(None, None, None)
        except LockLostError as exc:
            if request is None or self.answers.raises(exc):
                raise
            return await _answered(self.answers.lost(request, exc, rolled_back=False))
        except LockBackendError as exc:
            if request is None:
                raise
            _release_failed(name, exc, request)  # the view's work is done: answer it
        return result

    async def _leave_raised_async(
        self, lock: AsyncLock, name: str, exc: BaseException, request: Any
    ) -> None:
        try:
            await lock.__aexit__(type(exc), exc, exc.__traceback__)
        except LockBackendError as release_exc:
            _release_failed(name, release_exc, request)  # the original error goes on


async def _answered(answer: Any) -> Any:
    """A response, or what an async handler's coroutine returns."""
    return await answer if inspect.isawaitable(answer) else answer
