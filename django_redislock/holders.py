"""Who holds a lock: a thread (sync) or an asyncio task (async) of one process.

A ``Lock`` is only a handle. The holder is the thread that acquired through
it (the task, for ``AsyncLock``), per name and cache alias: any handle for
that name in the holding thread re-enters the hold instead of waiting on it,
and the name is free after that thread's last release. That is what makes a
hold handed to an open transaction (``@require_lock``, ``InventoryMixin``)
safe: the same thread taking the name again, in a second decorated call or a
``deduct()``, nests instead of waiting on itself until ``blocking_timeout``.

Each holder keeps a registry of what it holds. Its entries are weak: a hold
lives only while a handle that took (or re-entered) it is alive, so a hold
whose every handle was dropped without release stops being renewed and its
lease runs out, as if its process had died, and a long-lived thread never
keeps renewing a hold that nobody can release any more. A task gets a
registry of its own, never its parent's (a task copies its creator's context,
so the registry is checked against the task it belongs to). After
``fork()`` the child starts with an empty registry.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import weakref
from collections.abc import Hashable
from typing import Any, Generic, Protocol, TypeVar


class _Hold(Protocol):
    active: bool


_H = TypeVar("_H", bound=_Hold)


class Registry(Generic[_H]):
    """The holds of one holder, by (cache alias, key): weak references only.

    A hold that has ended (released, or forgotten after a loss) is no hold:
    ``get`` skips it, so nothing has to be taken out when a hold ends."""

    __slots__ = ("held", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()

    def get(self, key: Hashable) -> _H | None:
        found: _H | None = self.held.get(key)
        return found if found is not None and found.active else None

    def put(self, key: Hashable, holding: _H) -> None:
        self.held[key] = holding


class _ThreadRegistry(threading.local):
    registry: Registry[Any] | None = None


_threads = _ThreadRegistry()
_tasks: contextvars.ContextVar[tuple[weakref.ref[asyncio.Task[Any]], Registry[Any]] | None] = (
    contextvars.ContextVar("django_redislock_task_holds", default=None)
)


def thread_registry() -> Registry[Any]:
    """The current thread's holds (a fresh registry in a forked child)."""
    registry = _threads.registry
    if registry is None or registry.pid != os.getpid():
        registry = _threads.registry = Registry()
    return registry


def current_task(kind: str) -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError(f"{kind} must be used from inside an asyncio task.")
    return task


def task_registry(kind: str) -> Registry[Any]:
    """The current task's holds; never its parent's."""
    task = current_task(kind)
    entry = _tasks.get()
    if entry is None or entry[0]() is not task or entry[1].pid != os.getpid():
        entry = (weakref.ref(task), Registry())
        _tasks.set(entry)
    return entry[1]
