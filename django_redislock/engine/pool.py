"""A busy connection pool is a wait, never an outage.

redis-py's default ``ConnectionPool`` refuses a command at once when all of
its ``max_connections`` (100 by default in redis-py 8) are in use:
``MaxConnectionsError``, a ``ConnectionError``. Read as a Redis failure, a
burst of a few hundred threads made a healthy, idle Redis look down (503s,
"Redis is unreachable" in the log). Here a command that meets a full pool
waits for a connection to come free, as a ``BlockingConnectionPool`` would,
within its budget: an acquire's deadline (then the acquire is refused, a
``LockTimeout``), or ``PATIENCE`` for a command with none (then
``PoolExhausted``, which says the pool is too small, never that Redis is
unreachable).

A waiter is woken when one of this package's commands on the same client
ends (``freed``, one attribute read on the common path while nobody waits),
and at least every ``RECHECK`` seconds, for connections the site's own cache
calls give back, which no signal announces.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django_redislock.backend import client as backend

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a command with no deadline of its own (a release, an extend, a
#: renewal) waits for a free connection before ``PoolExhausted``.
PATIENCE = 30.0
#: The longest a waiter sleeps without a signal before it tries again: a
#: connection the site's own cache calls freed announces itself to nobody.
RECHECK = 0.05
#: A pool exhaustion that ended an acquire is logged at WARNING at most this
#: often per client (then at DEBUG): it tells an operator the pool is small.
WARN_EVERY = 60.0


class _Gate:
    """The threads of one client waiting for a connection of its pool."""

    __slots__ = ("_free", "_warned", "waiting")

    def __init__(self) -> None:
        self._free = threading.Condition(threading.Lock())
        self.waiting = 0
        self._warned = -WARN_EVERY

    def wait(self, until: float) -> bool:
        """Wait for a connection to come free, until ``until`` (monotonic);
        ``False`` once that has passed."""
        left = until - time.monotonic()
        if left <= 0:
            return False
        with self._free:
            self.waiting += 1
            try:
                self._free.wait(min(left, RECHECK))
            finally:
                self.waiting -= 1
        return True

    def freed(self) -> None:
        with self._free:
            self._free.notify()

    def warn_once(self) -> bool:
        """Whether to log this exhaustion at WARNING (at most every ``WARN_EVERY`` s)."""
        now = time.monotonic()
        if now - self._warned < WARN_EVERY:
            return False
        self._warned = now
        return True


class Gates:
    """A ``_Gate`` per client, held weakly (a client replaced by new settings
    is not kept); a forked child starts with none."""

    def __init__(self) -> None:
        self.reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        """None: new, or a forked child's (a lock a parent's thread held at
        the fork would never be let go in the child)."""
        self._gates: weakref.WeakKeyDictionary[Any, _Gate] = weakref.WeakKeyDictionary()
        self._mutex = threading.Lock()
        #: How many threads wait on any gate: 0 on the common path, which
        #: then reads this one attribute and nothing else (``freed``).
        self.waiting = 0

    def _gate(self, client: Any) -> _Gate:
        try:
            return self._gates[client]
        except (KeyError, TypeError):
            pass
        with self._mutex:
            try:
                return self._gates.setdefault(client, _Gate())
            except TypeError:  # not weakly referable: a gate of its own each time
                return _Gate()

    def freed(self, client: Any) -> None:
        """One of this package's commands on ``client`` ended: its connection is free."""
        if self.waiting:
            gate = self._gates.get(client)
            if gate is not None and gate.waiting:
                gate.freed()

    def wait(self, client: Any, until: float) -> bool:
        """Wait for a free connection of ``client``'s pool until ``until``
        (``False`` once it has passed)."""
        gate = self._gate(client)
        with self._mutex:
            self.waiting += 1
        try:
            return gate.wait(until)
        finally:
            with self._mutex:
                self.waiting -= 1

    def warn_once(self, client: Any) -> bool:
        return self._gate(client).warn_once()


gates = Gates()


def call(client: Any, deadline: float | None, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)``, a command on ``client``, waiting for a free connection of
    its pool until ``deadline`` (``None``: ``PATIENCE`` from now); then
    ``PoolExhausted``. Any other error is ``func``'s own."""
    until = deadline
    while True:
        try:
            return func(*args)
        except backend.BACKEND_ERRORS as exc:
            if not backend.pool_exhausted(exc):
                raise
            if until is None:
                until = time.monotonic() + PATIENCE
            if not gates.wait(client, until):
                raise exhausted(client, exc) from exc
        finally:
            gates.freed(client)


def send(script: Callable[..., T], client: Any, keys: Any, args: Any) -> T:
    """``script(client, keys, args)``: a release's or a renewal's one command,
    which has no budget to run out of, sent once a connection is free
    (``PATIENCE``). The common case costs a ``try`` and one attribute read."""
    try:
        return script(client, keys, args)
    except backend.BACKEND_ERRORS as exc:
        if not backend.pool_exhausted(exc):
            raise
        return call(client, None, script, client, keys, args)
    finally:
        if gates.waiting:
            gates.freed(client)


def exhausted(client: Any, exc: BaseException) -> backend.PoolExhausted:
    """The ``PoolExhausted`` for a wait on ``client``'s pool that ran out."""
    if isinstance(exc, backend.PoolExhausted):
        return exc
    size = backend.pool_size(client)
    return backend.PoolExhausted(f"no free connection in the pool (max_connections={size})", size)


def log_refused(client: Any) -> None:
    """An acquire's budget ran out while it waited for a connection: a
    timeout for its caller, and a hint for the operator that the pool is
    small for this process's load (once a minute per client at WARNING)."""
    size = backend.pool_size(client)
    level = logging.WARNING if gates.warn_once(client) else logging.DEBUG
    logger.log(
        level,
        "A lock acquire timed out waiting for a free connection of its cache's pool "
        "(max_connections=%s, all in use in this process; Redis itself was not asked): "
        "it was refused as for a busy lock. If this recurs, the pool is too small for the "
        'threads that use the cache at once: %s (docs/operations.md, "Pool sizing").',
        size,
        backend.POOL_SETTING,
    )
