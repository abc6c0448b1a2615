"""An acquire's ``blocking_timeout`` bounds its commands, even on a hung Redis.

redis-py has no per-command timeout: a command to a server that stopped
answering (paused, a VM being migrated, a partition that drops packets)
waits for the connection's socket timeout, or for ever without one. An
acquire's steps carry its deadline (``steps.Call.deadline``); the drivers
bound each step by what is left of it, through redis-py's public API only,
and on the connections of the cache's own pool (a pool of our own per
timeout once multiplied the process's connections by the buckets in use):

- sync: where the client's own socket timeout is no longer than the budget's
  bucket (``bucket``), it bounds the step already, and the step runs as it
  always did, in the caller's thread;
- sync, where it is longer (or the step must first set up a connection,
  ``must_connect``): the command runs on a worker thread (``Workers``, a few
  per server) and the caller waits for it at most the bucket; the worker
  finishes (or fails) at the connection's own socket timeout;
- asyncio: the awaited command runs under ``asyncio.timeout`` (``wait_for``
  before Python 3.11); redis.asyncio drops a connection whose command was
  cancelled.

A command abandoned this way may still run when Redis wakes up, so the
attempt's clean-up is handed to the janitor (``engine/janitor.py``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import math
import time
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.connection

from django_redislock.backend import family
from django_redislock.conf import generation
from django_redislock.engine import pool
from django_redislock.engine.workers import ServerPools

if TYPE_CHECKING:
    from collections.abc import Callable


logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The slack past ``blocking_timeout`` within which every acquire ends, even
#: on a server that stops answering near the deadline (docs/guarantees.md);
#: a step sent before the deadline gets at least this, less ``BOUND_MARGIN``
#: (a healthy but slow Redis must not be cut short).
FLOOR = 0.5
#: What the steps of an acquire keep clear of its bound (``blocking_timeout`` +
#: ``FLOOR``): they end by ``end_of(deadline)``, and the margin is for what
#: the acquire still does after its last step gave up, none of it bounded by
#: a socket: the caller's thread waking from its wait for the worker (or the
#: loop running the task again) on a loaded machine, the clean-up handed to
#: the janitor (maybe a thread started), the error raised with its chain, the
#: ``lock_failed`` / ``lock_contended`` signals and their logging. 20 ms was
#: too little on a busy 2-core CI runner (acquires 1-10 ms past the bound).
BOUND_MARGIN = 0.1
#: Buckets below ``FINE_UP_TO`` seconds are multiples of ``GRAIN``; above it they
#: grow by ``2 ** (1 / STEPS_PER_DOUBLING)`` (9 %), so a process needs few of them.
GRAIN = 0.25
FINE_UP_TO = 2.0
STEPS_PER_DOUBLING = 8
#: Clients whose socket timeout is remembered before the table starts over
#: (clients replaced by new settings), and servers with worker threads.
MAX_CLIENTS = 256


def end_of(deadline: float) -> float:
    """When the last step of an acquire with this ``deadline`` must have
    ended: its bound less ``BOUND_MARGIN``."""
    return deadline + FLOOR - BOUND_MARGIN


def step_limit(deadline: float, now: float | None = None) -> float:
    """How long a step sent ``now`` may take: what is left of the budget,
    and before the deadline at least the floor (less the margin); past the
    deadline only what is left until ``end_of(deadline)``, so steps sent one
    after another (an attempt, then leaving the queue) together end by then.
    0 or less: nothing is left, and the step is not sent at all (a minimum
    given to a step sent that late would end it past the bound)."""
    remaining = deadline - (time.monotonic() if now is None else now)
    return max(remaining, FLOOR - BOUND_MARGIN + min(remaining, 0.0))


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


def _connection_kwargs(client: Any) -> dict[str, Any]:
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # Redis Cluster: the node kwargs live on its nodes manager
        pool = getattr(client, "nodes_manager", None)
    return getattr(pool, "connection_kwargs", None) or {}


def own_socket_timeout(client: Any) -> float:
    """The socket timeout of the client's connections; infinite when they have none."""
    pool = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
    kwargs = _connection_kwargs(client)
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
    for cls in getattr(connection_class or redis.Connection, "__mro__", ()):  # valkey-py's
        # connection classes are given (the pool's ``connection_class``), never left out
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


def retries_timeouts(client: Any) -> bool:
    """Whether ``client`` sends a command again after a socket timeout: then
    its socket timeout bounds one try, not the command. A connection does
    (redis-py's and valkey-py's ``AbstractConnection``) when given a ``Retry``
    with retries that covers ``TimeoutError`` (``redis.Redis()`` built without
    a pool gets one on redis-py 6+: 3 retries, 10 on 8.x), or
    ``retry_on_timeout`` / ``retry_on_error``; django-redis's and Django's
    pools give none. A Redis Cluster client retries timeouts itself."""
    if getattr(client, "nodes_manager", None) is not None:
        retry = getattr(client, "retry", None)
        tries = getattr(client, "cluster_error_retry_attempts", None)  # redis-py 5.0
        return _retries(retry) > 0 if retry is not None else bool(tries)
    kwargs = _connection_kwargs(client)
    retry = kwargs.get("retry")
    errors = tuple(kwargs.get("retry_on_error") or ())
    if kwargs.get("retry_on_timeout"):
        return retry is None or _retries(retry) > 0
    if retry is None:
        return any(map(_is_timeout, errors))  # the connection makes a Retry(NoBackoff(), 1)
    supported = (*getattr(retry, "_supported_errors", (TimeoutError,)), *errors)
    return _retries(retry) > 0 and any(map(_is_timeout, supported))


def _is_timeout(error: Any) -> bool:
    return isinstance(error, type) and issubclass(error, (TimeoutError, *family.timeouts()))


def _retries(retry: Any) -> int:
    get = getattr(retry, "get_retries", None)  # redis-py 5.0 has only the attribute
    return int(get() if get is not None else getattr(retry, "_retries", 1))


class Limits:
    """Whether a command sent with some budget left needs a bound of its own:
    the bucket's seconds, or ``None`` where the client's own socket timeout
    is no longer (it bounds the command already); ``fits``: the same for an
    acquire's step, given its limit (``step_limit``).

    A client's socket timeout is read once per settings generation
    (``conf.generation``), as the clients themselves are; a client that
    sends a command again after a timeout (``retries_timeouts``) counts as
    one with none.
    """

    def __init__(self) -> None:
        self._own: dict[int, tuple[Any, float]] = {}
        self._generation = -1
        #: The last answer and the budgets it holds for: (client, generation,
        #: low, high, seconds). An uncontended acquire sends its one command with
        #: nearly its whole budget left, so this is what it finds.
        self._last: tuple[Any, int, float, float, float | None] = (None, -1, 0.0, 0.0, None)

    def get(self, client: Any, remaining: float) -> float | None:
        current = generation()
        last = self._last
        if last[0] is client and last[1] == current and last[2] < remaining <= last[3]:
            return last[4]
        low, seconds = bucket_range(remaining)
        bound = seconds if self._socket_timeout(client, current) > seconds else None
        self._last = (client, current, low, seconds, bound)
        return bound

    def fits(self, client: Any, seconds: float, round_trips: int) -> bool:
        """Whether ``client``'s own socket timeout ends ``round_trips`` round
        trips (a script's ``EVALSHA``, and after a ``NOSCRIPT`` its
        ``SCRIPT LOAD`` and ``EVALSHA`` again: each under the socket timeout,
        together under no bound) within ``seconds``."""
        return self._socket_timeout(client, generation()) * round_trips <= seconds

    def _socket_timeout(self, client: Any, current: int) -> float:
        if self._generation != current:
            self._own, self._generation = {}, current
        found = self._own.get(id(client))
        if found is not None and found[0] is client:
            return found[1]
        if len(self._own) >= MAX_CLIENTS:
            self._own = {}
        timeout = math.inf if retries_timeouts(client) else own_socket_timeout(client)
        self._own[id(client)] = (client, timeout)
        return timeout


limits = Limits()


def must_connect(client: Any) -> bool:
    """Whether ``client``'s next command will have to set up a connection
    first (none idle in its pool, or the one it would take was dropped):
    several round trips (``HELLO``, ``CLIENT SETINFO``, ...), each under the
    socket timeout, together under no bound at all. Read from the pools
    redis-py has had since 5.0, which hand out the idle connection released
    last; ``False`` for any other pool, whose steps run as they always did."""
    connections: Any = getattr(client, "connection_pool", None)
    try:
        kin = None if type(connections) is redis.ConnectionPool else family.of(connections)
        # first: isinstance() of an ABC is slow
        if kin is None or type(connections) is kin.connection_pool:
            idle = connections._available_connections
            if not idle and connections._created_connections >= connections.max_connections:
                return False  # at its cap it makes none: it refuses at once (engine/pool.py)
        elif isinstance(connections, kin.blocking_connection_pool):
            idle = connections.pool.queue  # None for a slot with no connection made yet
        else:
            return False
        last = idle[-1] if idle else None
    except (AttributeError, IndexError, TypeError):  # another redis-py: as before
        return False
    return last is None or getattr(last, "_sock", None) is None


#: Worker threads per server for commands that need a bound of their own: a
#: command that hangs keeps its worker until its socket timeout, so there are several.
MAX_WORKERS = 16


class Workers(ServerPools):
    """Run a command on a worker thread and wait for it at most ``seconds``.

    For commands the client's own socket timeout does not bound. Daemon
    threads (``daemons``): one left waiting on a hung Redis must not hold up
    the process's exit. Each server
    has workers of its own (``ServerPools``). The child of a ``fork()``
    starts with none.
    """

    def __init__(
        self, max_workers: int = MAX_WORKERS, name: str = "django-redislock-bounded"
    ) -> None:
        super().__init__(max_workers, name, MAX_CLIENTS)

    def call(self, seconds: float, func: Callable[..., T], *args: Any, server: object = None) -> T:
        """``func(*args)``; ``Abandoned`` when it has not answered in ``seconds``
        (counted from the call: a worker thread slow to start takes its time
        out of them, not on top)."""
        until = time.monotonic() + seconds
        future = self.submit(func, *args, server=server)
        try:
            return future.result(timeout=max(until - time.monotonic(), 0.0))
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
    its own socket timeout is that short, else on a worker thread
    (``Abandoned``); ``here``: in this thread, which its caller stops waiting
    for instead (a background writer's last write, at exit). For background
    writes (counters, history) that must not hold a process's exit up for a
    hung Redis. A full pool is waited for (``engine/pool.py``) as long as that."""
    deadline = time.monotonic() + seconds
    if here or limits.get(client, seconds) is None:
        return pool.call(client, deadline, func, client)
    bounded = functools.partial(workers.call, bucket(seconds), func, client, server=client)
    return pool.call(client, deadline, bounded)
