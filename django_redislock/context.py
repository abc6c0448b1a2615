"""What a holder runs, for operators: ``POST /shop/buy/42/``, a task, a command.

A lock records its holder as ``host:pid:thread`` (``base.holder_description``);
this module adds *what* that thread or task runs, so the dashboard and
``manage.py locks`` can say which request, task or command holds a name. In
order of precedence:

1. ``describe_holder("nightly invoice run")``: a context manager for users'
   own holders (a ``ContextVar``, so it follows threads and asyncio tasks and
   never leaks into the next request served by the same thread);
2. ``@require_lock`` on a view and ``HolderContextMiddleware`` set it to the
   request's method and path;
3. the running Celery task's name, when Celery is imported (looked up through
   ``sys.modules``: the core never imports Celery);
4. ``manage.py <command>`` when the process is a management command.

The description is stored in each lock value, permit and queued waiter, so it
is kept short (``MAX_LENGTH`` characters) and printable.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: Longest description kept; the rest is cut with an ellipsis.
MAX_LENGTH = 160
#: Separates ``host:pid:thread`` from what it runs in a holder description.
SEPARATOR = " | "
#: Commands that serve others' work: their holders are described by requests or tasks.
_SERVING_COMMANDS = frozenset({"runserver", "runserver_plus", "celery", "rqworker"})

_current: ContextVar[str | None] = ContextVar("django_redislock_holder", default=None)


def clean(text: str) -> str:
    """``text`` as one printable line of at most ``MAX_LENGTH`` characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(text))
    text = text.encode("utf-8", "replace").decode("utf-8").replace(SEPARATOR, " / ")
    return text if len(text) <= MAX_LENGTH else text[: MAX_LENGTH - 1] + "…"


@contextmanager
def describe_holder(description: str) -> Iterator[None]:
    """Describe the locks taken inside the block as running ``description``.

    >>> with describe_holder("import of supplier feed 7"):
    ...     with Lock("feed:7"): ...

    Nests (the innermost wins) and is restored on exit. Only acquires made
    inside the block are described: a lock records who took it, when it did.
    """
    token = _current.set(clean(description))
    try:
        yield
    finally:
        _current.reset(token)


def request_description(request: Any) -> str:
    return f"{request.method} {request.path}"


@contextmanager
def describing_request(request: Any | None) -> Iterator[None]:
    """``describe_holder`` with a request's method and path (nothing when ``None``)."""
    if request is None or _current.get() is not None:
        yield
        return
    with describe_holder(request_description(request)):
        yield


class HolderContextMiddleware:
    """Describe every lock a request takes by the request's method and path.

    ``@require_lock`` describes its own lock; this middleware covers the
    locks a view takes itself (``Lock(...)``, ``InventoryMixin.deduct``).
    Sync and async capable.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        with describing_request(request):
            return self.get_response(request)

    async def __acall__(self, request: Any) -> Any:
        with describing_request(request):
            return await self.get_response(request)


def _celery_task() -> str | None:
    celery = sys.modules.get("celery")
    if celery is None:
        return None
    task = getattr(celery, "current_task", None)
    try:
        name = getattr(task, "name", None)
    except Exception:  # a proxy with no task behind it
        return None
    return f"task {name}" if isinstance(name, str) and name else None


def _command() -> str | None:
    argv = sys.argv
    if len(argv) < 2:
        return None
    return _command_of(argv[0], argv[1])


@functools.lru_cache(maxsize=8)
def _command_of(program: str, command: str) -> str | None:
    """What a process started as ``program command ...`` runs (asked on every acquire)."""
    if os.path.basename(program) not in ("manage.py", "django-admin"):
        return None
    if command in _SERVING_COMMANDS:
        return None
    return "manage.py " + command


def current() -> str | None:
    """What the current thread or task runs, as the holder description's suffix."""
    described = _current.get()
    if described is not None:
        return described
    found = _celery_task() or _command()
    return clean(found) if found else None


def split(holder: str) -> tuple[str, str]:
    """``(host:pid:thread, what it runs)`` of a holder description (``""`` when unknown)."""
    who, _, what = holder.partition(SEPARATOR)
    return who, what
