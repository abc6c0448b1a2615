"""``@require_lock``: run a view, task or function under a lock named from its arguments.

``"sku:<pk>"`` names the lock from the call: ``<pk>`` is looked up in the
view's URL kwargs, then in the function's arguments by name; ``<request.user.pk>``
follows attributes (and mapping keys, for ``<self.kwargs.pk>``). The template is
checked when the decorator is applied, so a placeholder that no argument can
ever fill is an ``ImproperlyConfigured`` at import time, not a 500 per request.

A call is a *view call* when its first argument (or its second, after ``self``)
is an ``HttpRequest``. Then contention answers ``423 Locked`` with
``Retry-After``, and a name that cannot be used as a lock name (see
``base.check_name``: empty, longer than 1024 characters, control characters;
or a placeholder that is ``None``) is a ``BadRequest`` (400). Any other call
raises ``LockTimeout`` and ``ValueError`` instead.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from http import HTTPStatus
from typing import Any, Literal, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import BadRequest, ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from .async_locks import AsyncLock
from .base import check_alias, check_name, check_seconds
from .context import describing_request
from .exceptions import LockTimeout
from .locks import Lock, LockBase

F = TypeVar("F", bound=Callable[..., Any])

ContentionHandler = Callable[
    [HttpRequest, LockTimeout], HttpResponseBase | Awaitable[HttpResponseBase]
]
OnContention = int | ContentionHandler | Literal["raise"] | None

_PLACEHOLDER = re.compile(r"<([^<>]*)>")
_PATH = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*\Z")


class _Missing:
    pass


_MISSING = _Missing()

#: The locks ``require_lock`` holds in the current thread or task, so that a
#: decorated call nested in another one with the same lock name nests the
#: lock instead of waiting for itself until its blocking timeout.
_held: ContextVar[tuple[tuple[str, str | None, LockBase], ...]] = ContextVar(
    "django_redislock_require_lock_held", default=()
)

L = TypeVar("L", Lock, AsyncLock)


def _held_lock(kind: type[L], name: str, using: str | None) -> L | None:
    for held_name, held_using, lock in _held.get():
        # _holding() is per thread (Lock) or per task (AsyncLock): a copied
        # context in another thread or task does not count as holding
        if (
            held_name == name
            and held_using == using
            and isinstance(lock, kind)
            and lock._holding() is not None
        ):
            return lock
    return None


def _parse(template: object) -> list[str | tuple[str, ...]]:
    """The template as literal strings and placeholder paths."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, not {type(template).__name__}.")
    if not template:
        raise ValueError("template must not be empty.")
    parts: list[str | tuple[str, ...]] = []
    position = 0
    for match in _PLACEHOLDER.finditer(template):
        literal = template[position : match.start()]
        if "<" in literal or ">" in literal:
            raise ValueError(f"template {template!r} has an unmatched '<' or '>'.")
        if literal:
            parts.append(literal)
        path = match.group(1)
        if not _PATH.match(path):
            raise ValueError(
                f"template {template!r} has a malformed placeholder <{path}>; "
                "use <name> or <name.attribute>."
            )
        parts.append(tuple(path.split(".")))
        position = match.end()
    tail = template[position:]
    if "<" in tail or ">" in tail:
        raise ValueError(f"template {template!r} has an unmatched '<' or '>'.")
    if tail:
        parts.append(tail)
    return parts


def _check_on_contention(value: object) -> OnContention:
    if value is None or value == "raise" or callable(value):
        return cast(OnContention, value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f'on_contention must be an HTTP status (int), a callable or "raise", not {value!r}.'
        )
    if not 400 <= value <= 599:
        raise ValueError(f"on_contention status must be an error status (400-599), not {value}.")
    return value


def _is_request(value: object) -> bool:
    # a DRF Request wraps the HttpRequest in ``_request``
    return isinstance(value, HttpRequest) or isinstance(
        getattr(value, "_request", None), HttpRequest
    )


class _Plan:
    """How to name the lock for one decorated callable, worked out once."""

    def __init__(self, func: Callable[..., Any], parts: list[str | tuple[str, ...]]) -> None:
        self.parts = parts
        self.extra: dict[str, object] = {}
        if isinstance(func, functools.partial):
            # method_decorator hands each decorator the bound method as a partial
            self.signature = inspect.signature(func, follow_wrapped=False)
            owner = getattr(func.func, "__self__", None)
            if owner is not None:
                self.extra["self"] = owner
        else:
            self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        self.method = bool(params) and params[0].name in ("self", "cls")
        self.var_keyword = next(
            (p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )
        names = set(self.signature.parameters) | set(self.extra)
        for part in parts:
            if isinstance(part, tuple) and part[0] not in names and self.var_keyword is None:
                qualname = getattr(func, "__qualname__", repr(func))
                raise ImproperlyConfigured(
                    f"require_lock: placeholder <{'.'.join(part)}> can never be filled: "
                    f"{qualname}() has no argument {part[0]!r} and takes no **kwargs "
                    f"(URL kwargs). Its arguments are: {', '.join(self.signature.parameters)}."
                )

    def request_of(self, args: tuple[Any, ...]) -> Any | None:
        """The request when this is a view call, else ``None``."""
        index = 1 if self.method else 0
        if len(args) > index and _is_request(args[index]):
            return args[index]
        if index and args and _is_request(args[0]):
            return args[0]
        return None

    def name(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for this call; ``ValueError`` when it is unusable."""
        url_kwargs: Mapping[str, Any] = {}
        match = getattr(request, "resolver_match", None) if request is not None else None
        if match is not None:
            url_kwargs = match.kwargs
        bound = self.signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if self.var_keyword is not None:
            arguments.update(arguments.pop(self.var_keyword, {}))
        chunks = []
        for part in self.parts:
            if isinstance(part, str):
                chunks.append(part)
                continue
            root = part[0]
            if root in url_kwargs:
                value = url_kwargs[root]
            elif root in arguments:
                value = arguments[root]
            elif root in self.extra:
                value = self.extra[root]
            else:
                raise ValueError(f"placeholder <{'.'.join(part)}> was not given.")
            for attribute in part[1:]:
                found = getattr(value, attribute, _MISSING)
                if found is _MISSING and isinstance(value, Mapping):
                    found = value.get(attribute, _MISSING)
                if found is _MISSING:
                    raise ImproperlyConfigured(
                        f"require_lock: placeholder <{'.'.join(part)}>: "
                        f"{type(value).__name__} has no attribute {attribute!r}."
                    )
                value = found
            if value is None:
                raise ValueError(f"placeholder <{'.'.join(part)}> is None.")
            chunks.append(str(value))
        name = "".join(chunks)
        check_name(name, "lock name")
        return name


def _release_or_hold_until_commit(lock: Lock) -> None:
    """Release now, or when the enclosing database transaction ends.

    Under ``ATOMIC_REQUESTS`` (or any outer ``atomic()``) the function's writes
    commit after it returns. Releasing at the return would let the next holder
    read the row before those writes are visible and overwrite them: the lost
    update the lock is there to prevent. So the outermost hold is handed to
    the transaction, which releases it after its commit or rollback.
    """
    from django.db import connections

    holding = lock._holding()
    if holding is not None and holding.depth == 1:
        for connection in connections.all(initialized_only=True):
            if connection.in_atomic_block:
                from .models import TransactionLocks

                holds = TransactionLocks.of(connection)
                if lock.name not in holds.locks:
                    holds.hold([lock])
                    return
                break
    lock.__exit__(None, None, None)


def _retry_after_header(error: LockTimeout) -> str:
    seconds = error.retry_after
    return str(max(1, math.ceil(seconds))) if seconds else "1"


def require_lock(
    template: str,
    *,
    timeout: float | None = None,
    blocking_timeout: float | None = None,
    on_contention: OnContention = None,
    using: str | None = None,
) -> Callable[[F], F]:
    """Run the decorated view or function only while holding the lock ``template`` names.

    ``timeout``, ``blocking_timeout`` and ``using`` mean what they mean for
    ``Lock`` (defaults from ``REDISLOCK``). ``on_contention`` shapes a view's
    answer when the lock cannot be had in time: ``None`` for ``423 Locked``,
    another error status, a callable ``(request, LockTimeout) -> response``
    (sync or async), or ``"raise"`` to let ``LockTimeout`` propagate. Calls
    that are not view calls always raise ``LockTimeout``.
    """
    parts = _parse(template)
    check_seconds(timeout, "timeout")
    check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    check_alias(using)
    handler = _check_on_contention(on_contention)

    def contended(request: Any, error: LockTimeout) -> Any:
        if request is None or handler == "raise":
            raise error
        if callable(handler):
            return handler(request, error)
        response = HttpResponse(
            f"{error.name} is busy; try again shortly.\n",
            status=handler or HTTPStatus.LOCKED,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = _retry_after_header(error)
        return response

    def decorator(func: F) -> F:
        plan = _Plan(func, parts)

        def lock_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
            request = plan.request_of(args)
            try:
                return plan.name(request, args, kwargs), request
            except ValueError as exc:
                if request is None:
                    raise
                raise BadRequest(f"Cannot lock {template!r}: {exc}") from exc

        if iscoroutinefunction(func):

            async def _async_view(*args: Any, **kwargs: Any) -> Any:
                name, request = lock_name(args, kwargs)
                lock = _held_lock(AsyncLock, name, using) or AsyncLock(
                    name, timeout=timeout, blocking_timeout=blocking_timeout, using=using
                )
                with describing_request(request):
                    retry = await lock._acquire(None, None)
                if retry is not None:
                    answer = contended(request, lock._timeout_error(retry))
                    return await answer if inspect.isawaitable(answer) else answer
                token = _held.set((*_held.get(), (name, using, lock)))
                try:
                    result = await func(*args, **kwargs)
                except BaseException as exc:
                    await lock.__aexit__(type(exc), exc, exc.__traceback__)
                    raise
                finally:
                    _held.reset(token)
                await lock.__aexit__(None, None, None)
                return result

            wrapper = functools.wraps(func)(_async_view)
            return cast(F, markcoroutinefunction(wrapper))

        def _view(*args: Any, **kwargs: Any) -> Any:
            name, request = lock_name(args, kwargs)
            lock = _held_lock(Lock, name, using) or Lock(
                name, timeout=timeout, blocking_timeout=blocking_timeout, using=using
            )
            with describing_request(request):
                retry = lock._acquire(None, None)
            if retry is not None:
                return contended(request, lock._timeout_error(retry))
            token = _held.set((*_held.get(), (name, using, lock)))
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                lock.__exit__(type(exc), exc, exc.__traceback__)
                raise
            finally:
                _held.reset(token)
            _release_or_hold_until_commit(lock)
            return result

        return cast(F, functools.wraps(func)(_view))

    return decorator
