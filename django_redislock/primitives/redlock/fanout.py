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

Each server has a pool of its own (``engine/workers.ServerPools``, as the
bounded commands have): at most ``WORKERS_PER_SERVER`` daemon threads and
its own queue, so calls stuck on a hung server hold only that
server's workers, and the calls to the others are still sent at once (with
one shared pool a hung minority took every worker, and a healthy majority
was never asked). When all of a server's workers are held by calls whose
callers already stopped waiting, the server is taken as hung: its next calls
fail at once (``redis.TimeoutError``, no answer) instead of queueing behind
them, until a worker is free again (each call carries its deadline to the
pool, which refuses it: ``workers.Hung``). Workers exit after ``IDLE_EXIT``
seconds without work. Pools belong to one ``Servers`` (one Redlock
resolution, see ``redlock_servers``) and are rebuilt in a child after
``fork()``, where the parent's threads do not exist.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from django_redislock.backend import client as backend
from django_redislock.engine.bounds import own_socket_timeout
from django_redislock.engine.steps import Pause, QuorumStep
from django_redislock.engine.workers import Hung, ServerPools

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


def _call(
    batch: _Batch,
    index: int,
    client: Any,
    script: Script,
    keys: Sequence[Any],
    args: Sequence[Any],
    context: contextvars.Context,
    deadline: float | None,
) -> None:
    """One server's call, on its worker: skipped when its caller stopped
    waiting before a worker took it (see the module docstring)."""
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
        # made per settings generation, so no fork hook (one is never
        # unregistered): in a forked child it resets on its first use
        self._pools = ServerPools(
            WORKERS_PER_SERVER,
            "redislock-fanout",
            max(len(self.clients), 1),
            idle_exit=IDLE_EXIT,
            hook_fork=False,
        )
        self._limits = tuple(own_socket_timeout(c) for c in self.clients)

    def __len__(self) -> int:
        return len(self.clients)

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
        sent = time.monotonic()
        deadlines = {i: _deadline(sent, timeout, self._limits[i]) for i in indices}
        for index in indices:
            # a copy each: one context cannot be entered by two threads at once
            context = contextvars.copy_context()
            client, deadline = self.clients[index], deadlines[index]
            try:
                self._pools.submit(
                    _call, batch, index, client, script, keys, args, context, deadline,
                    server=client, deadline=deadline,
                )  # fmt: skip
            except Hung:
                batch.finish(index, redis.TimeoutError(HUNG))
            except RuntimeError as exc:  # no worker could start
                batch.finish(index, redis.TimeoutError(f"not sent: {exc}"))
        try:
            self._wait(batch, deadlines)
        finally:
            with batch.done:
                # calls no worker took yet are skipped, unless the caller
                # stopped waiting because it had enough: the rest are told too
                batch.abandoned = not batch.answered
                results = list(batch.results)  # late replies land in the batch only
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, backend.BACKEND_ERRORS):
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


def _deadline(sent: float, timeout: float | None, socket_timeout: float) -> float | None:
    limits = [t for t in (timeout, socket_timeout) if t and t != math.inf]
    return sent + min(limits) if limits else None


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
