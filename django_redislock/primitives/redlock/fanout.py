"""One script on several independent servers at once, for ``Redlock``.

Each server's call is an ordinary ``Script`` call (``Redis.evalsha``, so
``execute_command``: tracing, retries and a client subclass all see it), made
by a small pool of worker threads so that N servers cost about one round trip.
redis-py's synchronous API has no public way to send without waiting for the
reply, hence threads rather than one thread writing to every socket.

A server that does not answer within the reply timeout counts as a
``redis.TimeoutError`` for that call; its worker stays with it (at most the
connection's socket timeout, after which redis-py drops the connection, so a
late reply is never read as the answer to a later command) while other workers
serve the next calls. A call that no worker took before its caller gave up,
or before its reply deadline (a caller that returned with enough answers, see
``Servers.run``), is skipped, so a stalled server does not receive a backlog
of stale attempts.

Each server has a pool of its own: at most ``WORKERS_PER_SERVER`` daemon
threads and its own queue, so calls stuck on a hung server hold only that
server's workers, and the calls to the others are still sent at once (with
one shared pool a hung minority took every worker, and a healthy majority
was never asked). When all of a server's workers are held by calls whose
callers already stopped waiting, the server is taken as hung: its next calls
fail at once (``redis.TimeoutError``, no answer) instead of queueing behind
them, until a worker is free again. Workers exit after ``IDLE_EXIT`` seconds
without work. Pools belong to one ``Servers`` (one Redlock resolution, see
``redlock_servers``) and are rebuilt in a child after ``fork()``, where the
parent's threads do not exist.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from django_redislock.backend.client import BACKEND_ERRORS
from django_redislock.engine.steps import Pause, QuorumStep
from django_redislock.engine.threads import Lifecycle

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script

T = TypeVar("T")

#: Upper bound of worker threads per server (a stalled server holds one each):
#: its cap of calls in flight.
WORKERS_PER_SERVER = 8
#: Seconds an idle worker waits for work before it exits.
IDLE_EXIT = 30.0


class _Batch:
    """One fan-out: a result slot per server, and which slots are settled.

    ``short`` counts down the replies of 1 its caller still needs before it
    stops waiting for the rest (``None``: it waits for every server)."""

    __slots__ = ("abandoned", "done", "results", "settled", "short", "unsettled")

    def __init__(self, count: int, unsettled: int, enough: int | None = None) -> None:
        self.results: list[Any] = [None] * count
        self.settled = [False] * count
        self.unsettled = unsettled
        self.short = enough
        self.done = threading.Condition(threading.Lock())
        self.abandoned = False

    def finish(self, index: int, result: Any) -> None:
        with self.done:
            if not self.settled[index]:  # else it already timed out
                self.results[index] = result
                self.settled[index] = True
                self.unsettled -= 1
                if self.short is not None and result == 1:
                    self.short -= 1
                if self.enough:  # the caller wakes once, or at a deadline
                    self.done.notify()

    @property
    def answered(self) -> bool:
        """As many servers answered 1 as the caller needs (under ``done``)."""
        return self.short is not None and self.short <= 0

    @property
    def enough(self) -> bool:
        """The caller has all it waits for (under ``done``)."""
        return not self.unsettled or self.answered


#: A call: its batch, the server's index and client, the script, its KEYS and
#: ARGV, the caller's context, and when its caller stops waiting for it (``None``: never).
_Job = tuple[
    _Batch, int, Any, "Script", Sequence[Any], Sequence[Any], contextvars.Context, float | None
]


class _Pool:
    """One server's daemon worker threads and job queue; grown on demand, bounded.

    ``waiting`` counts jobs queued and not yet taken, ``idle`` the workers
    waiting for one, ``running`` the jobs being run, each with its caller's
    deadline (all changed under ``_mutex`` only): a new worker starts when
    more jobs wait than workers do, and an idle worker leaves only when no
    queued job needs it.
    """

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        # one per server, made and dropped at run time: ``Servers`` replaces
        # them all in a forked child (``_live_pools``)
        self.life = Lifecycle("redislock-fanout", lambda: None, hook_fork=False)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._mutex = threading.Lock()
        self._waiting = 0
        self._idle = 0
        self._workers = 0
        self._running: dict[int, float | None] = {}

    def submit(self, job: _Job) -> bool:
        """Queue ``job``; ``False`` (not queued) when the server is hung (``_hung``)."""
        with self._mutex:
            if self._hung(time.monotonic()):
                return False
            self._waiting += 1
            if self._waiting > self._idle and self._workers < self.max_workers:
                if self.life.start(self._work) is None:  # nothing was started
                    if not self._workers:  # nobody would ever take the job
                        self._waiting -= 1
                        return False
                else:
                    self._workers += 1  # (under _mutex: the thread cannot count itself out first)
        self._jobs.put(job)
        return True

    def _hung(self, now: float) -> bool:
        """Every worker there can be is held by a call its caller gave up on:
        a job queued now would wait for one of them to come back (up to the
        socket timeout) and be too late anyway."""
        running = self._running.values()
        return len(self._running) >= self.max_workers and all(
            deadline is not None and deadline <= now for deadline in running
        )

    def _next(self) -> _Job | None:
        """The next job, or ``None`` when this worker should exit (idle)."""
        while True:
            with self._mutex:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._mutex:
                    self._idle -= 1
                    if self._waiting <= self._idle:  # the queued jobs have takers
                        self._workers -= 1
                        return None
                continue
            with self._mutex:
                self._idle -= 1
                self._waiting -= 1
                self._running[threading.get_ident()] = job[-1]
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._do(job)
            finally:
                with self._mutex:
                    del self._running[threading.get_ident()]
            # This frame idles in _next for up to IDLE_EXIT: it must not keep the
            # last job (or an error whose traceback reaches a holding) alive.
            job = None

    @staticmethod
    def _do(job: _Job) -> None:
        batch, index, client, script, keys, args, context, deadline = job
        if batch.abandoned or (deadline is not None and time.monotonic() > deadline):
            result: Any = redis.TimeoutError("the caller stopped waiting before it was sent")
        else:
            try:  # in the caller's context: a tracer's span of it has the caller's parent
                result = context.run(script, client, keys, args)
            except Exception as exc:  # handed to the caller, which decides
                result = exc
        batch.finish(index, result)


class Servers:
    """The clients of a Redlock's independent servers and the threads that call them."""

    def __init__(self, clients: Sequence[Any]) -> None:
        self.clients = tuple(clients)
        self._pools = self._new_pools()
        self._limits = tuple(_socket_timeout(c) for c in self.clients)

    def __len__(self) -> int:
        return len(self.clients)

    def _new_pools(self) -> tuple[_Pool, ...]:
        return tuple(_Pool(WORKERS_PER_SERVER) for _ in self.clients)

    def _live_pools(self) -> tuple[_Pool, ...]:
        pools = self._pools
        if pools and pools[0].life.pid != os.getpid():  # forked: the parent's workers are not here
            pools = self._pools = self._new_pools()
        return pools

    def run(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[Any],
        *,
        timeout: float | None,
        only: Sequence[int] | None = None,
        enough: int | None = None,
    ) -> list[Any]:
        """Run ``script`` on every server (or those numbered in ``only``) at once.

        One result per server, in order: the reply, or the exception (Redis
        and connection errors; ``redis.TimeoutError`` when no reply came within
        ``timeout`` or the connection's socket timeout); servers not in
        ``only`` get ``None``. A hung server's call fails at once (see the
        module docstring). Any other exception is raised.

        With ``enough``, it returns as soon as that many servers answered 1
        (a renewal or a fence write that has its majority), with ``None`` for
        the servers that
        had not answered yet: their calls are still sent (until their reply
        deadline), and a server that hangs costs nothing more than one that
        answers at once.
        """
        indices = range(len(self.clients)) if only is None else tuple(only)
        batch = _Batch(len(self.clients), len(indices), enough)
        pools = self._live_pools()
        sent = time.monotonic()
        deadlines = {i: _deadline(sent, timeout, self._limits[i]) for i in indices}
        for index in indices:
            # a copy each: one context cannot be entered by two threads at once
            context = contextvars.copy_context()
            job = (batch, index, self.clients[index], script, keys, args, context, deadlines[index])
            if not pools[index].submit(job):
                batch.finish(index, redis.TimeoutError(HUNG))
        try:
            self._wait(batch, deadlines)
        finally:
            with batch.done:
                # calls no worker took yet are skipped, unless the caller
                # stopped waiting because it had enough: the rest are told too
                batch.abandoned = not batch.answered
                results = list(batch.results)  # late replies land in the batch only
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, BACKEND_ERRORS):
                raise result
        return results

    @staticmethod
    def _wait(batch: _Batch, deadlines: dict[int, float | None]) -> None:
        """Wait for every reply, each until its own deadline; late ones time out."""
        with batch.done:
            while True:
                now = time.monotonic()
                for index, deadline in list(deadlines.items()):
                    if not batch.settled[index] and deadline is not None and deadline <= now:
                        batch.results[index] = redis.TimeoutError("no reply in time")
                        batch.settled[index] = True
                        batch.unsettled -= 1
                    if batch.settled[index]:
                        del deadlines[index]
                if not deadlines or batch.enough:
                    return
                bounded = [d for d in deadlines.values() if d is not None]
                batch.done.wait(min(bounded) - now if bounded else None)


#: Why a call to a hung server was not sent.
HUNG = (
    "not sent: every connection to this server is still held by a call that got "
    "no reply in time (the server is hung)"
)


def _deadline(sent: float, timeout: float | None, socket_timeout: float | None) -> float | None:
    limits = [t for t in (timeout, socket_timeout) if t]
    return sent + min(limits) if limits else None


def _socket_timeout(client: Any) -> float | None:
    """The connections' socket timeout (public ``connection_kwargs``), if any."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None


def run_on_all(
    servers: Servers,
    script: Script,
    keys: Sequence[str | bytes],
    args: Sequence[Any],
    *,
    timeout: float | None,
    only: Sequence[int] | None = None,
    enough: int | None = None,
) -> list[Any]:
    """``servers.run(...)``: the one place every Redlock fan-out passes."""
    return servers.run(script, keys, args, timeout=timeout, only=only, enough=enough)


def run_quorum(steps: Generator[QuorumStep, Any, T], servers: Servers) -> T:
    """Run quorum ``steps`` (``primitives/redlock/quorum.py``): each ``FanOut`` on every server at
    once, through redis-py's public path; a ``Pause`` sleeps."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                reply = None
            else:
                call = step.call
                reply = run_on_all(
                    servers, call.script, call.keys, call.args, timeout=step.timeout, only=step.only
                )
        except BaseException as exc:
            reply, error = None, exc
