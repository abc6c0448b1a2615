"""An acquire's ``blocking_timeout`` bounds its commands, even on a hung Redis.

redis-py has no per-command timeout: a command to a server that stopped
answering (paused, a VM being migrated, a partition that drops packets)
waits for the connection's socket timeout, or for ever without one. An
acquire's steps carry its deadline (``protocol.Call.deadline``); the drivers
bound each step by what is left of it, through redis-py's public API only:

- sync: the step runs on a *sibling* of the cache's client, the same client
  class on a ``ConnectionPool`` built from the cache pool's public
  ``connection_class`` and ``connection_kwargs``, whose socket timeout is the
  remaining budget rounded up to a bucket (``bucket``). Siblings are cached per
  client and bucket; a command that still hangs is cut by that timeout;
- sync on a pool that has no plain sibling (Sentinel, Cluster, custom
  pools): the command runs on a worker thread (``Workers``) and the caller
  waits for it at most the bucket; the worker finishes (or fails) at the
  connection's own socket timeout;
- asyncio: the awaited command runs under ``asyncio.timeout`` (``wait_for``
  before Python 3.11); redis.asyncio drops a connection whose command was
  cancelled.

Either only where needed: a client whose own socket timeout is no longer
than the bucket bounds the step already, and runs it as it always did.

A command abandoned this way may still run when Redis wakes up, so the
attempt's clean-up is handed to the janitor (``engine/janitor.py``).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock.conf import generation
from django_redislock.engine.workers import ServerPools

if TYPE_CHECKING:
    from collections.abc import Callable


logger = logging.getLogger(__name__)

T = TypeVar("T")

#: No bounded command gets less than this (a healthy but slow Redis must not be
#: cut short): the slack past ``blocking_timeout`` for a server that stops
#: answering near the deadline.
FLOOR = 0.5
#: Buckets below ``FINE_UP_TO`` seconds are multiples of ``GRAIN``; above it they
#: grow by ``2 ** (1 / STEPS_PER_DOUBLING)`` (9 %), so a process needs few siblings.
GRAIN = 0.25
FINE_UP_TO = 2.0
STEPS_PER_DOUBLING = 8
#: Siblings kept before the cache is emptied (clients replaced by new settings).
MAX_SIBLINGS = 256


def bucket(remaining: float) -> float:
    """The socket timeout for a command sent with ``remaining`` seconds of budget.

    Never below ``remaining`` (a timeout always means the budget ran out),
    never below ``FLOOR``, at most ``GRAIN`` or 9 % above it.
    """
    return bucket_range(remaining)[1]


def bucket_range(remaining: float) -> tuple[float, float]:
    """``(low, seconds)``: every budget in ``(low, seconds]`` has the bucket ``seconds``."""
    if remaining <= FLOOR:
        return -math.inf, FLOOR
    if remaining <= FINE_UP_TO:
        seconds = GRAIN * math.ceil(remaining / GRAIN)
        return seconds - GRAIN, seconds
    step = math.ceil(STEPS_PER_DOUBLING * math.log2(remaining))
    seconds = float(2.0 ** (step / STEPS_PER_DOUBLING))
    return float(2.0 ** ((step - 1) / STEPS_PER_DOUBLING)), seconds


@dataclass(frozen=True, slots=True)
class Bound:
    """How to bound one step: run it on ``client`` (a sync sibling; ``None``
    where the topology has none, Sentinel and Cluster) within ``seconds``."""

    client: Any
    seconds: float


def own_socket_timeout(client: Any) -> float:
    """The socket timeout of the client's connections; infinite when they have none."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # Redis Cluster: the node kwargs live on its nodes manager
        pool = getattr(client, "nodes_manager", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "socket_timeout" in kwargs:
        timeout = kwargs["socket_timeout"]
    else:
        connection_class = getattr(pool, "connection_class", None)
        timeout = default_socket_timeout(connection_class or kwargs.get("connection_class"))
    return float(timeout) if timeout else math.inf


def default_socket_timeout(connection_class: Any) -> float | None:
    """What a connection of this class times out after when it is given no
    ``socket_timeout``: redis-py 8 gives 5 s, earlier versions none. Read
    from its constructor's signature, so it follows redis-py (and a
    connection class of one's own) rather than a table of versions."""
    for cls in getattr(connection_class or redis.Connection, "__mro__", ()):
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            continue
        if parameter is not None:
            default = parameter.default
            if isinstance(default, bool) or not isinstance(default, int | float):
                return None
            return float(default) if default > 0 else None
    return None


def _sibling(client: Any, seconds: float) -> Any | None:
    """``client``'s class on a new plain pool whose commands time out after ``seconds``.

    Its retry policy retries only broken connections (a timed-out command
    resent would outlive the budget). ``None`` for pools other than redis-py's
    plain ones (Sentinel, Cluster, custom pools).
    """
    pool: Any = getattr(client, "connection_pool", None)
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return None
    kwargs = dict(pool.connection_kwargs)
    connect_timeout = kwargs.get("socket_connect_timeout")
    kwargs.update(
        socket_timeout=seconds,
        socket_connect_timeout=min(float(connect_timeout or math.inf), seconds),
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        retry_on_timeout=False,
        retry_on_error=[],
    )
    sibling_pool = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    sibling = type(client)(connection_pool=sibling_pool)
    # A forgotten sibling (new settings) must close its sockets, not leave them
    # to the garbage collector: a connection collected in a cycle may lose its
    # socket before it can close it (a ResourceWarning in the user's tests).
    # Not at exit, though: finalizers run before the janitor's last clean-ups
    # (Janitor.drain_at_exit), which may need this very pool.
    weakref.finalize(sibling, sibling_pool.disconnect).atexit = False
    return sibling


class Siblings:
    """Bounds per (client, bucket): ``None`` where the client bounds a step itself.

    Forgotten when ``CACHES`` or ``REDISLOCK`` change (``conf.generation``), as
    the clients they mirror are.
    """

    def __init__(self) -> None:
        self._found: dict[tuple[int, float], tuple[Any, Bound | None]] = {}
        self._generation = -1
        #: The last answer and the budgets it holds for: (client, generation,
        #: low, high, bound). An uncontended acquire sends its one command with
        #: nearly its whole budget left, so this is what it finds.
        self._last: tuple[Any, int, float, float, Bound | None] = (None, -1, 0.0, 0.0, None)

    def get(self, client: Any, remaining: float) -> Bound | None:
        current = generation()
        last = self._last
        if last[0] is client and last[1] == current and last[2] < remaining <= last[3]:
            return last[4]
        low, seconds = bucket_range(remaining)
        bound = self._get(client, seconds, current)
        self._last = (client, current, low, seconds, bound)
        return bound

    def _get(self, client: Any, seconds: float, current: int) -> Bound | None:
        key = (id(client), seconds)
        found = self._found.get(key)
        if found is not None and found[0] is client and self._generation == current:
            return found[1]
        if self._generation != current:
            self._found, self._generation = {}, current
        bound = None
        if own_socket_timeout(client) > seconds:
            bound = Bound(_sibling(client, seconds), seconds)
        if len(self._found) >= MAX_SIBLINGS:
            self._found = {}
        self._found[key] = (client, bound)
        return bound


siblings = Siblings()


def must_connect(client: Any) -> bool:
    """Whether ``client``'s next command will have to set up a connection
    first (none idle in its pool, or the one it would take was dropped):
    several round trips (``HELLO``, ``CLIENT SETINFO``, ...), each under the
    socket timeout, together under no bound at all. Read from the pools
    redis-py has had since 5.0, which hand out the idle connection released
    last; ``False`` for any other pool, whose steps run as they always did."""
    pool = getattr(client, "connection_pool", None)
    try:
        if type(pool) is redis.ConnectionPool:  # first: isinstance() of an ABC is slow
            idle = pool._available_connections
        elif isinstance(pool, redis.BlockingConnectionPool):
            idle = pool.pool.queue  # None for a slot with no connection made yet
        else:
            return False
        last = idle[-1] if idle else None
    except (AttributeError, IndexError, TypeError):  # another redis-py: as before
        return False
    return last is None or getattr(last, "_sock", None) is None


#: Worker threads per server for commands on pools without a plain sibling: a
#: command that hangs keeps its worker until its socket timeout, so there are several.
#: Waits (``BLPOP``) have threads of their own (``drivers.waits``): a command
#: queued behind them would wait up to a wait chunk for a thread.
MAX_WORKERS = 16


class Workers(ServerPools):
    """Run a command on a worker thread and wait for it at most ``seconds``.

    For pools with no plain sibling. Daemon threads (``daemons``): one left
    waiting on a hung Redis must not hold up the process's exit. Each server
    has workers of its own (``ServerPools``). The child of a ``fork()``
    starts with none.
    """

    def __init__(
        self, max_workers: int = MAX_WORKERS, name: str = "django-redislock-bounded"
    ) -> None:
        super().__init__(max_workers, name, MAX_SIBLINGS)

    def call(self, seconds: float, func: Callable[..., T], *args: Any, server: object = None) -> T:
        """``func(*args)``; ``Abandoned`` when it has not answered in ``seconds``."""
        future = self.submit(func, *args, server=server)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError as exc:
            raise abandoned(future, seconds) from exc


class Abandoned(TimeoutError):
    """A command on a worker thread that the caller stopped waiting for.

    ``after``: its future while it may still reach Redis (a clean-up must wait
    for it: it runs on a connection of its own, and may not even be sent
    yet); ``None`` when it never started.
    """

    def __init__(self, message: str, after: concurrent.futures.Future[Any] | None) -> None:
        super().__init__(message)
        self.after = after


def abandoned(future: concurrent.futures.Future[Any], seconds: float) -> Abandoned:
    """The error for a worker's ``future`` given up on after ``seconds``."""
    return Abandoned(f"no answer within {seconds} s", None if future.cancel() else future)


workers = Workers()


def within(client: Any, seconds: float, func: Callable[[Any], T], *, here: bool = False) -> T:
    """``func(client)``, given up after about ``seconds``: on ``client`` when
    its own socket timeout is that short, else on a sibling with that timeout,
    else on a worker thread (``Abandoned``); ``here``: in this thread, which
    its caller stops waiting for instead (a background writer's last write,
    at exit). For background writes (counters, history) that must not hold
    a process's exit up for a hung Redis."""
    bound = siblings.get(client, seconds)
    if bound is None:
        return func(client)
    if bound.client is not None:
        return func(bound.client)
    if here:
        return func(client)
    return workers.call(bound.seconds, func, client, server=client)
