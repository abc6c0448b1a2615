"""A pool of worker threads that never holds up the process's exit.

``concurrent.futures.ThreadPoolExecutor`` joins its workers when Python
exits. A worker left waiting on a hung Redis (frozen, or behind a partition
that drops packets) with no socket timeout never comes back, so a process
whose acquire once gave up on such a server could not exit at all: it hung
in Python's exit handler. These workers are daemon threads; one still
waiting at exit is simply dropped with the process, like the command it was
sending (its attempt's clean-up, ``engine/janitor.py``, was the server's to
receive anyway).

Workers start on demand up to ``max_workers`` and exit after ``idle_exit``
seconds without work; ``ServerPools`` keeps such a pool per server. A child
of ``fork()`` starts with none (the parent's threads, and a lock one of them
held, are not in the child).

A job may carry the deadline its caller stops waiting at. When every worker
a pool can have runs a job past its deadline, the server is taken as hung
(``Hung``): a job queued now would wait for one of them to come back (up to
the socket timeout) and be too late anyway, so it is refused at once. A job
checks its own staleness when it starts (the pool runs it regardless).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django_redislock.engine.threads import Lifecycle

T = TypeVar("T")

_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...], float | None]


class Hung(RuntimeError):
    """Not queued: every worker is held by a job whose caller gave up on it."""


class DaemonPool:
    """Run calls on daemon worker threads; each answers a ``Future``."""

    def __init__(self, max_workers: int, name: str, idle_exit: float = 30.0) -> None:
        self.max_workers = max_workers
        self.name = name
        self.idle_exit = idle_exit
        self.reset()
        # made and dropped at run time (one per server): its ServerPools resets it
        self._life = Lifecycle(name, self.reset, hook_fork=False)

    def reset(self) -> None:
        """No workers and no jobs: new, or a forked child's."""
        self._mutex = threading.Lock()
        self._ready = threading.Condition(self._mutex)
        self._jobs: collections.deque[_Job] = collections.deque()
        self._idle = 0
        self._workers = 0
        #: the deadline of each job being run, by its worker's thread ident
        self._running: dict[int, float | None] = {}

    def submit(
        self, func: Callable[..., T], *args: Any, deadline: float | None = None
    ) -> concurrent.futures.Future[T]:
        """Queue ``func(*args)``, whose caller stops waiting at ``deadline``
        (``time.monotonic()``; ``None``: never). ``Hung`` when the pool is
        (``hung``); ``RuntimeError`` when no worker runs and none can start
        (the process's thread limit; at exit, on Python 3.12)."""
        self._life.forked()  # without the hooks (os.fork from C)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        job = (future, func, args, deadline)
        with self._mutex:
            if self._running and self._hung(time.monotonic()):
                raise Hung(f"every {self.name} worker is held by a job past its deadline")
            self._jobs.append(job)
            if len(self._jobs) <= self._idle or self._workers >= self.max_workers:
                self._ready.notify()
                return future
            self._workers += 1  # before it runs: it counts itself out when idle
            if self._life.start(self._work) is None:  # it never ran
                self._workers -= 1
                if self._workers == 0:  # nobody would ever take the job
                    self._jobs.remove(job)
                    raise RuntimeError(f"can't start new thread ({self.name})")
            # (an interrupt inside start() leaves the count: the thread runs)
        return future

    def _hung(self, now: float) -> bool:
        """Every worker there can be runs a job its caller gave up on (under ``_mutex``)."""
        running = self._running.values()
        return len(self._running) >= self.max_workers and all(
            deadline is not None and deadline <= now for deadline in running
        )

    def workers(self) -> int:
        """Worker threads alive or starting."""
        with self._mutex:
            return self._workers

    def _next(self) -> _Job | None:
        """The next job; ``None`` once idle for ``idle_exit`` (the worker exits)."""
        with self._mutex:
            while not self._jobs:
                self._idle += 1
                try:
                    woken = self._ready.wait(self.idle_exit)
                finally:
                    self._idle -= 1
                if not woken and not self._jobs:
                    self._workers -= 1
                    return None
            job = self._jobs.popleft()
            self._running[threading.get_ident()] = job[3]
            return job

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            job = self._next()
            if job is None:
                return
            future, func, args, _ = job
            job = None  # this frame idles next: it must keep no job alive
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = func(*args)
                    except BaseException as exc:  # the caller's to see, as an executor's
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._mutex:
                    self._running.pop(me, None)  # (gone after a fork's reset)
            del future, func, args


class ServerPools:
    """A ``DaemonPool`` per server (``server=``: the client a call goes to).

    One pool for every server let one that hangs keep all its workers, each
    on a call with no socket timeout to end it, and every call to the healthy
    servers then waited behind them. Servers are held weakly: a client
    replaced by new settings is not kept open. A forked child starts with none
    (``hook_fork=False`` for one made at run time, see ``Lifecycle``: it
    resets on its next use there).
    """

    def __init__(
        self,
        max_workers: int,
        name: str,
        max_servers: int,
        *,
        idle_exit: float = 30.0,
        hook_fork: bool = True,
    ) -> None:
        self.max_workers = max_workers
        self.name = name
        self.max_servers = max_servers
        self.idle_exit = idle_exit
        self.reset()
        self._life = Lifecycle(name, self.reset, hook_fork=hook_fork)

    def reset(self) -> None:
        """No pools: new, or a forked child's."""
        self._mutex = threading.Lock()
        self._pools: dict[int, tuple[Callable[[], object], DaemonPool]] = {}

    def submit(
        self,
        func: Callable[..., T],
        *args: Any,
        server: object = None,
        deadline: float | None = None,
    ) -> concurrent.futures.Future[T]:
        """Queue ``func(*args)`` on ``server``'s pool (``DaemonPool.submit``)."""
        self._life.forked()  # without the hooks (os.fork from C)
        with self._mutex:
            found = self._pools.get(id(server))
            if found is None or found[0]() is not server:
                if len(self._pools) >= self.max_servers:  # clients replaced by new settings
                    self._pools = {}
                found = self._pools[id(server)] = (
                    _weak(server),
                    DaemonPool(self.max_workers, self.name, self.idle_exit),
                )
        return found[1].submit(func, *args, deadline=deadline)

    def workers(self) -> int:
        """Worker threads alive or starting, for every server."""
        with self._mutex:
            pools = [pool for _, pool in self._pools.values()]
        return sum(pool.workers() for pool in pools)


def _weak(server: object) -> Callable[[], object]:
    """A weak reference to ``server``; a strong one to what has none (``None``)."""
    try:
        return weakref.ref(server)
    except TypeError:
        return lambda: server
