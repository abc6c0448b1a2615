"""``@require_lock`` and ``@require_slot``: run a view, task or function under a
lock (or one of N slots) named from its arguments.

``"sku:<pk>"`` names the lock from the call (``NamePlan``, written once for
both decorators): ``<pk>`` is looked up in the call's arguments by name,
then in the view's URL kwargs, then in the function's defaults;
``<request.user.pk>`` follows attributes (and mapping keys, for
``<self.kwargs.pk>``). The template is parsed, and checked against the
decorated callable's signature, when the decorator is applied: a placeholder
that no argument can ever fill is an ``ImproperlyConfigured`` at import
time, not a 500 per request. Here, with the other arguments' checks, because
a template is the decorators' first argument; ``guards.py`` asks the plan
for each call's name.

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

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponseBase

from django_redislock import guards, responses
from django_redislock.exceptions import LockBackendError, LockLostError, LockTimeout
from django_redislock.primitives.semaphore import check_limit
from django_redislock.validation import check_alias, check_lease, check_name, check_seconds

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
    Requests`` with ``Retry-After`` from what the key's calls take (their
    average hold, see ``holds.estimates.slot_retry_after``) (``None``
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


# the template: lock names from "sku:<pk>", filled from each call ----------------------

_PLACEHOLDER = re.compile(r"<([^<>]*)>")
_PATH = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*\Z")


class _Missing:
    pass


_MISSING = _Missing()


def parse_template(template: object) -> list[str | tuple[str, ...]]:
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


def is_request(value: object) -> bool:
    # a DRF Request wraps the HttpRequest in ``_request``
    return isinstance(value, HttpRequest) or isinstance(
        getattr(value, "_request", None), HttpRequest
    )


class NamePlan:
    """How to name the lock for one decorated callable, worked out once."""

    def __init__(
        self,
        func: Callable[..., Any],
        parts: list[str | tuple[str, ...]],
        decorator: str = "require_lock",
    ) -> None:
        self.parts = parts
        #: Who the errors name: the decorator the template was given to.
        self.decorator = decorator
        self.extra: dict[str, object] = {}
        # method_decorator hands each decorator the bound method as a partial,
        # or (a list of decorators) another decorator's wrapper of it: its
        # ``__wrapped__`` chain goes on past the partial to the unbound method,
        # whose ``self`` would take the request's place
        inner = inspect.unwrap(func, stop=lambda f: isinstance(f, functools.partial))
        if isinstance(inner, functools.partial):
            self.signature = inspect.signature(inner, follow_wrapped=False)
            owner = getattr(inner.func, "__self__", None)
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
                    f"{decorator}: placeholder <{'.'.join(part)}> can never be filled: "
                    f"{qualname}() has no argument {part[0]!r} and takes no **kwargs "
                    f"(URL kwargs). Its arguments are: {', '.join(self.signature.parameters)}."
                )

    def request_of(self, args: tuple[Any, ...]) -> Any | None:
        """The request when this is a view call, else ``None``."""
        index = 1 if self.method else 0
        if len(args) > index and is_request(args[index]):
            return args[index]
        if index and args and is_request(args[0]):
            return args[0]
        return None

    def name(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for this call; ``ValueError`` when it is unusable.

        A placeholder is filled from the arguments the call was given, then
        the URL kwargs of the request, then the function's defaults: a view
        gets its URL kwargs as arguments anyway, and a function that takes a
        request but is called by another view (whose URL kwargs say nothing
        of it) must lock the name it was called for.
        """
        url_kwargs: Mapping[str, Any] = {}
        match = getattr(request, "resolver_match", None) if request is not None else None
        if match is not None:
            url_kwargs = match.kwargs
        bound = self.signature.bind_partial(*args, **kwargs)
        given = dict(bound.arguments)
        if self.var_keyword is not None:
            given.update(given.pop(self.var_keyword, {}))
        bound.apply_defaults()
        defaults = bound.arguments
        chunks = []
        for part in self.parts:
            if isinstance(part, str):
                chunks.append(part)
                continue
            root = part[0]
            for source in (given, url_kwargs, defaults, self.extra):
                if root in source:
                    value = source[root]
                    break
            else:
                raise ValueError(f"placeholder <{'.'.join(part)}> was not given.")
            for attribute in part[1:]:
                if value is None:  # <request.user.profile.pk> without a profile
                    raise ValueError(f"placeholder <{'.'.join(part)}> is None.")
                # A mapping's key first, as Django's templates look up: in
                # <request.GET.items> "items" is the query's key, not the method.
                if isinstance(value, Mapping):
                    found = value.get(attribute, _MISSING)
                    if found is _MISSING:  # a key the request left out: its fault (400)
                        raise ValueError(f"placeholder <{'.'.join(part)}> was not given.")
                else:
                    found = getattr(value, attribute, _MISSING)
                if found is _MISSING:
                    raise ImproperlyConfigured(
                        f"{self.decorator}: placeholder <{'.'.join(part)}>: "
                        f"{type(value).__name__} has no attribute {attribute!r}."
                    )
                value = found
            if value is None:
                raise ValueError(f"placeholder <{'.'.join(part)}> is None.")
            chunks.append(str(value))
        name = "".join(chunks)
        check_name(name, "lock name")
        return name
