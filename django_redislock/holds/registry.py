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

A handle's view of its holder's holds is ``Handles``: one stateless object per
kind of holder (``THREAD_HANDLES``, ``TASK_HANDLES``), which a handle's class
names and whose methods take the handle, so nothing is built for it per handle.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from django_redislock.holds.holding import Holding


class _Hold(Protocol):
    active: bool
    detached: bool


_H = TypeVar("_H", bound=_Hold)

#: What a holder's registry knows a hold by: (cache alias, lock key) for a
#: ``Lock``; (its servers' aliases, sorted, lock key) for a ``Redlock``.
HoldKey = tuple[str | tuple[str, ...], str]


#: Entries a registry keeps before it drops those whose hold was collected.
PRUNE_AT = 1024


class Registry(Generic[_H]):
    """The holds of one holder, by (cache alias, key): weak references only.

    A hold that has ended (released, or forgotten after a loss) is no hold:
    ``get`` skips it. A plain dict of ``weakref.ref``s, not a
    ``WeakValueDictionary``: that one's item access is Python code, run
    twice per acquire. An entry whose hold was collected (released, or its
    handles dropped) stays until its key is used again or the registry grows
    past ``prune_at``."""

    __slots__ = ("handles", "held", "pid", "prune_at")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: dict[Hashable, weakref.ref[Any]] = {}
        self.prune_at = PRUNE_AT
        #: a task's only: the handles' per-task tables to clear when it is
        #: done (``forget_when_done``), by id, each gone with its handle
        self.handles: dict[int, weakref.ref[Any]] = {}

    def get(self, key: Hashable) -> _H | None:
        ref = self.held.get(key)
        if ref is None:
            return None
        found: _H | None = ref()
        return found if found is not None and found.active else None

    def put(self, key: Hashable, holding: _H) -> None:
        held = self.held
        if len(held) >= self.prune_at:
            for stale in [k for k, ref in held.items() if ref() is None]:
                del held[stale]
            self.prune_at = max(PRUNE_AT, 2 * len(held))  # many held at once: prune less often
        held[key] = weakref.ref(holding)


class _ThreadRegistry(threading.local):
    registry: Registry[Any] | None = None


_threads = _ThreadRegistry()
#: Each task's registry, by task, in a table shared by the contexts copied
#: from the first task that used one: a task's entry survives its context
#: variables being overwritten by a copy of another context (asgiref's
#: ``sync_to_async`` copies the thread's context back into the task, and a
#: task that ``async_to_sync`` ran in that thread set its own value there).
_tasks: contextvars.ContextVar[weakref.WeakKeyDictionary[asyncio.Task[Any], Registry[Any]] | None]
_tasks = contextvars.ContextVar("django_redislock_task_holds", default=None)


def thread_registry() -> Registry[Any]:
    """The current thread's holds (a fresh registry in a forked child)."""
    registry = _threads.registry
    if registry is None or registry.pid != os.getpid():
        registry = _threads.registry = Registry()
    return registry


def current_task(kind: str) -> asyncio.Task[Any]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop: asyncio's message names no primitive
        task = None
    if task is None:
        raise RuntimeError(f"{kind} must be used from inside an asyncio task.")
    return task


def forget_when_done(kind: str, table: weakref.WeakKeyDictionary[Any, Any]) -> None:
    """Drop the current task's entry of ``table`` (what a handle took in it)
    once the task is done, as a thread's ``threading.local`` goes with the
    thread: a finished task still referenced somewhere (a list of jobs)
    would otherwise keep its holds renewed for good. One callback per task
    (``task_registry``) clears every table: one per handle would pile up on
    a long-lived task that uses a new handle per job."""
    handles = task_registry(kind).handles
    key = id(table)
    if key not in handles:
        handles[key] = weakref.ref(table, lambda _: handles.pop(key, None))


def _forget_handles(registry: Registry[Any], task: asyncio.Task[Any]) -> None:
    for ref in list(registry.handles.values()):
        table = ref()
        if table is not None:
            table.pop(task, None)
    registry.handles.clear()


def task_registry(kind: str) -> Registry[Any]:
    """The current task's holds; never its parent's."""
    task = current_task(kind)
    registries = _tasks.get()
    if registries is None:
        registries = weakref.WeakKeyDictionary()
        _tasks.set(registries)
    registry = registries.get(task)
    if registry is None or registry.pid != os.getpid():
        registry = registries[task] = Registry()
        task.add_done_callback(functools.partial(_forget_handles, registry))
    return registry


class _Handle(Protocol):
    """A lock handle (``Lock``, ``AsyncLock``, ``Redlock``), as its ``Handles`` use it."""

    def _own_hold_key(self) -> HoldKey:
        """What the holder's registry knows this handle's name and cache alias by."""
        ...


class Handles:
    """A lock handle's view of its holder's holds (``Lock``, ``AsyncLock``,
    ``Redlock``): one stateless object per kind of holder, the thread
    (``THREAD_HANDLES``) or the asyncio task (``TASK_HANDLES``), named by the
    handle's class (``_handles``); every method is given the handle. No object
    per handle: a view builds a new ``Lock`` per request.

    A handle remembers the holds it took or re-entered in the current holder
    (``entered``, latest last), which are what keep them alive; its release,
    ``extend`` and ``owned`` apply to the latest of those, else to the
    holder's hold of the name taken through another handle (``registry``).
    """

    __slots__ = ()

    def entered(self, handle: Any) -> list[Holding]:
        """The holds ``handle`` took or re-entered in the current holder, latest last."""
        raise NotImplementedError

    def registry(self) -> Registry[Holding]:
        """The current holder's holds."""
        raise NotImplementedError

    def current(self, handle: _Handle, key: HoldKey | None) -> Holding | None:
        """The hold a release, extend or ``owned`` of ``handle`` applies to: the
        latest one it took, else the current holder's hold of the name (taken
        through another handle); ``key`` is its ``_own_hold_key()`` when it is
        at hand."""
        taken = self.taken(handle)
        if taken is not None:
            return taken
        if key is None:
            key = handle._own_hold_key()
        return self.registry().get(key)

    def taken(self, handle: _Handle, entered: list[Holding] | None = None) -> Holding | None:
        """The latest hold ``handle`` took in the current holder and has not
        released to the end (``current`` without its fallback); ``entered``:
        ``entered(handle)``, when the caller has it."""
        if entered is None:
            entered = self.entered(handle)
        while entered and not entered[-1].active and entered[-1].lost is None:
            if entered[-1].detached:  # kept for the block it was detached in to leave
                return None
            entered.pop()  # released to the end through another handle
        return entered[-1] if entered else None

    def reentry(self, key: HoldKey, registry: Registry[Holding] | None = None) -> Holding | None:
        """The current holder's live hold of the name, to nest into; a hold
        already known lost is reported once more, forgotten and not nested into
        (the caller acquires afresh; the handle that took it is told at its
        release). ``registry``: ``registry()``, when the caller has it."""
        holding = (registry or self.registry()).get(key)
        if holding is not None and holding.lost is not None:
            supersede(holding, holding.lost)
            return None
        return holding

    def took(
        self,
        handle: _Handle,
        key: HoldKey,
        holding: Holding,
        registry: Registry[Holding] | None = None,
    ) -> None:
        """Record a new or re-entered hold for ``handle`` and its holder: one
        call per acquire (the registry's ``put`` written in, but for a prune)."""
        entered = self.entered(handle)
        if holding.depth == 1:
            registry = registry or self.registry()
            held = registry.held
            if len(held) >= registry.prune_at:
                registry.put(key, holding)
            else:
                held[key] = weakref.ref(holding)
            while entered and entered[-1].detached:  # handed off earlier: over
                entered.pop()
        entered.append(holding)

    def left(self, handle: _Handle, holding: Holding, entered: list[Holding] | None = None) -> None:
        """After a release of ``holding`` through ``handle``, whatever its
        outcome; ``entered``: ``entered(handle)``, when the caller has it."""
        if entered is None:
            entered = self.entered(handle)
        if not holding.active and holding.lost is None:  # released to the end
            if len(entered) == 1 and entered[0] is holding:  # the common case
                entered.pop()
            else:
                entered[:] = [h for h in entered if h is not holding]
        elif entered and entered[-1] is holding:
            # one level left; of a hold found lost, each outer level this
            # handle entered is still told so (LockLostError) at its release
            entered.pop()


def supersede(holding: Holding, reason: str) -> None:
    """Report ``holding`` lost and end it: its holder no longer holds it."""
    holding.mark_lost(reason)
    holding.end()


class _ThreadHandle(_Handle, Protocol):
    _local: threading.local


class ThreadHandles(Handles):
    """The holder is the current thread (``Lock``, ``Redlock``).

    A handle's ``_local``, a ``threading.local`` made when it is built, keeps
    what it entered in each thread."""

    __slots__ = ()

    def entered(self, handle: _ThreadHandle) -> list[Holding]:
        entered: list[Holding] | None = getattr(handle._local, "entered", None)
        if entered is None or (entered and entered[0].pid != os.getpid()):
            entered = handle._local.entered = []  # new thread, or inherited through fork()
        return entered

    #: the function itself, not a method calling it: once per acquire
    registry = staticmethod(thread_registry)


class _TaskHandle(_Handle, Protocol):
    _entered_by: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]]


class TaskHandles(Handles):
    """The holder is the current asyncio task (``AsyncLock``).

    A handle's ``_entered_by``, a ``WeakKeyDictionary`` by task made when it
    is built, keeps what it entered in each task, an entry forgotten when its
    task is done (``forget_when_done``). ``kind`` is what the error outside
    a task calls the handle."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def entered(self, handle: _TaskHandle) -> list[Holding]:
        task = current_task(self.kind)
        entered = handle._entered_by.get(task)
        if entered is None or (entered and entered[0].pid != os.getpid()):
            if entered is None:
                forget_when_done(self.kind, handle._entered_by)
            entered = handle._entered_by[task] = []
        return entered

    def registry(self) -> Registry[Holding]:
        return task_registry(self.kind)


THREAD_HANDLES = ThreadHandles()
TASK_HANDLES = TaskHandles("AsyncLock")
