"""``@require_lock`` and ``@require_slot``: run a view, task or function under a
lock (or one of N slots) named from its arguments.

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

``@require_slot`` is the same on a ``Semaphore``: at most ``limit`` calls at
once per name, ``429 Too Many Requests`` when none frees in time. The calls
themselves run in ``guards.py``; this module checks the arguments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from django.http import HttpRequest, HttpResponseBase

from django_redislock import guards, responses
from django_redislock.exceptions import LockBackendError, LockLostError, LockTimeout
from django_redislock.naming import NamePlan, parse_template
from django_redislock.primitives.semaphore import check_limit
from django_redislock.validation import check_alias, check_lease, check_seconds

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
    parts, answers = _checked(
        template,
        timeout=timeout,
        blocking_timeout=blocking_timeout,
        handlers=(on_contention, on_backend_error, on_lock_lost),
        using=using,
    )

    def decorator(func: F) -> F:
        plan = NamePlan(func, parts)
        return guards.wrap(
            func, guards.Guard(func, template, plan, answers, (timeout, blocking_timeout))
        )

    return decorator


def require_slot(
    template: str,
    *,
    limit: int,
    timeout: float | None = None,
    blocking_timeout: float | None = None,
    on_contention: OnContention = None,
    on_backend_error: OnBackendError = None,
    on_lock_lost: OnLockLost = None,
    using: str | None = None,
) -> Callable[[F], F]:
    """Run the decorated view or function only while holding one of ``limit``
    slots of the key ``template`` names: at most ``limit`` calls at once per key.

    A ``Semaphore`` named from the call, as ``require_lock`` names a ``Lock``:
    the same template syntax, the same sync, async, class-based and plain
    callables, the same options. Slots are granted in arrival order. When no
    slot frees within ``blocking_timeout`` a view answers ``429 Too Many
    Requests`` with ``Retry-After`` from the semaphore's own hint (``None``
    for ``on_contention``; another status, a callable or ``"raise"`` as for
    ``require_lock``); other calls raise ``LockTimeout``. Redis unreachable is
    a ``503``, and a lock lost under the view a ``409``, as for
    ``require_lock``; the slot's own permit lost while the call ran is logged,
    not answered: the work is done, and a slot guards no data.

    Unlike a lock, the slot is released when the view returns, not handed to
    its database transaction: it limits load, it does not guard writes. A
    nested call for the same key takes a second slot (as
    ``threading.Semaphore`` does), so it can wait on itself when ``limit`` is
    reached. Every user of a key must pass the same ``limit``.
    """
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"require_slot: limit must be an int, not {limit!r} ({type(limit).__name__})."
        )
    check_limit(limit)
    parts, answers = _checked(
        template,
        timeout=timeout,
        blocking_timeout=blocking_timeout,
        handlers=(on_contention, on_backend_error, on_lock_lost),
        using=using,
        limit=limit,
    )

    def decorator(func: F) -> F:
        plan = NamePlan(func, parts, "require_slot")
        options = (timeout, blocking_timeout)
        return guards.wrap(func, guards.SlotGuard(limit, func, template, plan, answers, options))

    return decorator


def _checked(
    template: str,
    *,
    timeout: float | None,
    blocking_timeout: float | None,
    handlers: tuple[object, object, object],
    using: str | None,
    limit: int | None = None,
) -> tuple[list[str | tuple[str, ...]], responses.Answers]:
    """The decorators' arguments checked, when the decorator is applied: the
    parsed template and the answers of a view call."""
    parts = parse_template(template)
    check_lease(timeout)
    check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    check_alias(using)
    on_contention, on_backend_error, on_lock_lost = handlers
    answers = responses.Answers(
        on_contention=_check_on_contention(on_contention),
        on_backend_error=_check_on_contention(on_backend_error, "on_backend_error"),
        on_lock_lost=_check_on_contention(on_lock_lost, "on_lock_lost"),
        timeout=timeout,
        using=using,
        limit=limit,
    )
    return parts, answers
