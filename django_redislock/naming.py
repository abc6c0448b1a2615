"""Lock names from templates: ``"sku:<pk>"`` filled from a call's arguments.

Written once for the decorators that name a lock per call. ``<pk>`` is looked
up in the call's arguments by name, then in the view's URL kwargs, then in the
function's defaults; ``<request.user.pk>`` follows attributes (and mapping keys,
for ``<self.kwargs.pk>``). A template is parsed, and checked against the
decorated callable's signature, when the decorator is applied: a placeholder no
argument can ever fill is an ``ImproperlyConfigured`` at import time, not a 500
per request.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from django_redislock.validation import check_name

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
