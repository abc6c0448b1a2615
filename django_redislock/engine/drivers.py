"""Thin drivers that run a protocol (``engine/steps.py``) on a client.

``run`` does the steps with a synchronous redis-py client, ``run_async`` on
asyncio through an ``AsyncConnection`` (natively, or in a worker thread where
the topology has no asyncio client); ``Redlock``'s quorum steps have a driver of
their own beside its servers (``primitives/redlock/fanout.py``). Each sends a
step's reply back into the protocol, or throw the step's exception into it, so clean-up and error
translation live in the protocol, once. A step that carries its acquire's
deadline is bounded by it even when Redis stops answering (``engine/bounds.py``);
the others run as they always did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from django_redislock.backend import aio as async_clients
from django_redislock.backend import client as backend
from django_redislock.engine import bounds, janitor
from django_redislock.engine.steps import Call, Step

if TYPE_CHECKING:
    from collections.abc import Sequence

    from django_redislock.backend.scripts import Script

T = TypeVar("T")

#: Threads per server for the worker-thread fallback's waits and reads
#: (``AsyncConnection.call``), never the loop's default executor: each waiter
#: holds one for up to its wait chunk, and a handful of waiters would stall
#: whatever else the site runs there (``asyncio.to_thread``,
#: ``sync_to_async(thread_sensitive=False)``, DNS lookups). Waiters beyond
#: this many queue for a thread (a late wake-up, never a lost one: the
#: signal stays in its list). A set per server (``ServerPools``): a hung
#: server with no socket timeout keeps the threads of its calls, and with
#: one set for every server, waiters on the healthy ones queued behind them.
#: Bounded waits on a pool with no sibling run here too, never on the
#: commands' workers (``bounds.workers``): each holds its thread for up to a
#: wait chunk, and an acquire or a release queued behind them waited as long.
WAIT_WORKERS = 64
waits = bounds.Workers(WAIT_WORKERS, "django-redislock-waits")


def _cancel_requests() -> int:
    """How many cancellations of the current task are pending (0 before Python 3.11)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


class AsyncConnection:
    """Run scripts and commands on asyncio, natively or in a worker thread."""

    def __init__(self, sync_client: Any) -> None:
        self.sync = sync_client
        self.aio = async_clients.get_async_client(sync_client)
        self._cancels_before = _cancel_requests()

    async def run(self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        if self.aio is not None:
            return await script.run_async(self.aio, keys, args)
        return await in_thread(script, self.sync, keys, args)

    async def run_to_the_end(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        """``run``, shielded: a release goes on to Redis when its caller is
        cancelled (an ``asyncio.timeout`` or a ``TaskGroup`` ending around an
        ``async with``). Cut short, it would leave the lock or permit held by
        nobody for its whole lease; the caller still gets ``CancelledError``.

        The shielded release is a task of the loop, and a loop that ends
        (``asyncio.run``'s coroutine returned, Ctrl-C) cancels every task
        left (once) and then waits for them: cancelled that way, the release
        is sent again, so the loop runs until Redis answered, or
        ``janitor.CLEANUP_TIMEOUT`` passed (a hung Redis).
        Sent twice, a release is harmless: the second finds the token gone,
        and an inner level's never frees the lock."""
        return await asyncio.shield(self._resent_if_cancelled(script, keys, args))

    async def _resent_if_cancelled(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        try:
            return await self.run(script, keys, args)
        except asyncio.CancelledError:  # the loop is ending (see run_to_the_end)
            uncancel = getattr(asyncio.current_task(), "uncancel", None)
            if uncancel is not None:  # Python 3.11+: no cancellation pending now
                uncancel()
        # a hung Redis must not hold the exit up
        return await _bounded(self.run(script, keys, args), janitor.CLEANUP_TIMEOUT)

    async def wait_signal(self, key: str | bytes, timeout: float) -> tuple[bytes, bytes] | None:
        """``BLPOP`` one waiter's signal list: ``(key, value)``, or ``None`` in time."""
        signal = await self.call("blpop", [key], timeout=timeout)
        return None if signal is None else (signal[0], signal[1])

    def honour_lost_cancellation(self) -> None:
        """Raise ``CancelledError`` if the task was cancelled during a step
        that returned all the same.

        redis.asyncio writes each command under ``asyncio.wait_for``, which
        before Python 3.12 returns normally when the task is cancelled just as
        the write completes (CPython gh-86296): a waiter would carry on
        waiting until its ``blocking_timeout``, an attempt would return the
        grant to a task that was cancelled. Python 3.11 still counts the
        request (``Task.cancelling``, compared with its count when this
        connection was made), so ``run_async`` honours it after each step; on
        Python 3.10 the lost cancellation cannot be seen.
        """
        if _cancel_requests() > self._cancels_before:
            raise asyncio.CancelledError

    async def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if self.aio is not None:
            return await getattr(self.aio, command)(*args, **kwargs)
        # a wait (BLPOP) grants nothing: a clean-up need not follow it
        run = functools.partial(getattr(self.sync, command), *args, **kwargs)
        future = waits.submit(contextvars.copy_context().run, run, server=self.sync)
        return await asyncio.wrap_future(future)


async def _bounded(run: Awaitable[T], seconds: float) -> T:
    """``run``, given up (``TimeoutError``) after ``seconds``."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await run
    return await asyncio.wait_for(run, seconds)


async def in_thread(func: Callable[..., T], server: Any, *args: Any) -> T:
    """``asyncio.to_thread(func, server, *args)`` on ``server``'s bounded
    commands' daemon workers (not joined at exit), except when cancelled: the ``CancelledError``
    then carries ``after``, the command's future while it may still reach
    Redis (``None`` when it never started, or ended). The attempt's clean-up
    follows it (``janitor.Janitor``): sent at once on another connection, it
    could reach Redis first, find nothing to undo, and the late acquire would
    leave the name held by nobody for its whole lease."""
    run = contextvars.copy_context().run
    future = bounds.workers.submit(run, func, server, *args, server=server)
    return await follow(asyncio.wrap_future(future), future)


async def follow(run: Awaitable[T], future: concurrent.futures.Future[Any]) -> T:
    """Await ``run``, ``future``'s on a worker thread; a cancellation carries
    what a clean-up must follow (``in_thread``)."""
    try:
        return await run
    except asyncio.CancelledError as exc:
        exc.after = None if future.cancel() or future.done() else future  # type: ignore[attr-defined]
        raise


def run(steps: Generator[Step, Any, T], client: Any) -> T:
    """Run ``steps`` on a synchronous redis-py client."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        after, error = getattr(error, "after", None), None  # what a clean-up must follow
        try:
            if isinstance(step, Call) and step.background:  # after ``after``, by the janitor
                janitor.janitor.submit(client, step, after)
                reply = None
            elif step.deadline is not None:
                reply = _run_bounded(step, client, step.deadline)
            elif isinstance(step, Call):
                reply = step.script(client, step.keys, step.args)
            else:
                reply = backend.blpop(client, step.key, step.timeout)
        except BaseException as exc:
            reply, error = None, exc


#: What a command cut by a socket timeout or ``asyncio.timeout`` raises.
_TIMEOUTS = (redis.TimeoutError, TimeoutError, asyncio.TimeoutError)


def _unanswered(step: Step, client: Any, deadline: float, exc: BaseException) -> None:
    """Raise ``Unanswered`` for a timeout once the acquire's deadline passed;
    a clean-up that went unanswered is handed to the janitor."""
    if isinstance(exc, backend.Unanswered) or time.monotonic() < deadline:
        return
    after = getattr(exc, "after", None)  # bounds.Abandoned: a worker's command
    if isinstance(step, Call) and step.shield:
        janitor.janitor.submit(client, step, after)
    raise backend.Unanswered(f"no answer within the blocking timeout: {exc}", after) from exc


def _sync_call(step: Step, client: Any, bound: bounds.Bound | None) -> tuple[Any, tuple[Any, ...]]:
    """The function and arguments that run ``step`` on a synchronous ``client``."""
    if isinstance(step, Call):
        return step.script, (client, step.keys, step.args)
    return backend.blpop, (client, step.key, _blpop_timeout(step.timeout, bound))


def _blpop_timeout(timeout: float, bound: bounds.Bound | None) -> float:
    """A ``BLPOP`` under a bound waits at most its share of it (as under a socket timeout)."""
    if bound is None:
        return timeout
    return max(backend.MIN_WAIT_CHUNK, min(timeout, bound.seconds * backend.SOCKET_TIMEOUT_SHARE))


def _threads(step: Step) -> bounds.Workers:
    """The threads a bounded ``step`` runs on where there is no sibling:
    a wait on the waits' own (``waits``), a command on the commands'."""
    return bounds.workers if isinstance(step, Call) else waits


def _run_bounded(step: Step, client: Any, deadline: float) -> Any:
    """Run ``step`` so that it ends soon after ``deadline`` even on a hung Redis,
    or on a slow one where it must set up a connection first (``must_connect``:
    each round trip of that is under the socket timeout, all of them under no
    bound), then on a worker thread waited for at most the budget."""
    remaining = deadline - time.monotonic()
    bound = bounds.siblings.get(client, remaining)
    try:
        if bound is None and isinstance(step, Call) and not bounds.must_connect(client):
            # the common case: the client's own socket timeout bounds the command
            return step.script(client, step.keys, step.args)
        if bound is not None and bound.client is None:  # no sibling: a worker thread
            func, args = _sync_call(step, client, bound)
            # the caller's context: a tracer's span of the command keeps its parent
            run = contextvars.copy_context().run
            return _threads(step).call(bound.seconds, run, func, *args, server=client)
        target = client if bound is None else bound.client
        func, args = _sync_call(step, target, bound)
        if bounds.must_connect(target):
            seconds = bounds.bucket(remaining) if bound is None else bound.seconds
            run = contextvars.copy_context().run
            return _threads(step).call(seconds, run, func, *args, server=target)
        return func(*args)
    except _TIMEOUTS as exc:
        _unanswered(step, client, deadline, exc)
        raise


async def _within(
    step: Step,
    conn: AsyncConnection,
    run: Awaitable[T],
    seconds: float,
    future: concurrent.futures.Future[T] | None = None,
) -> T:
    """Await ``run`` for at most ``seconds``; redis.asyncio drops the connection
    of a command cancelled this way. ``future``: ``run``'s worker (the
    fallback), which may go on after that. A cancellation carries it
    (``follow``) from outside the bound: before Python 3.11 the bound is
    ``asyncio.wait_for``, which runs ``run`` in a task of its own and raises
    a cancellation of its own."""
    assert step.deadline is not None
    bounded = _bounded(run, seconds)
    if future is not None and isinstance(step, Call):  # a wait grants nothing
        bounded = follow(bounded, future)
    try:
        try:
            return await bounded
        except _TIMEOUTS as exc:
            if future is None:
                raise
            raise bounds.abandoned(future, seconds) from exc
    except _TIMEOUTS as exc:
        _unanswered(step, conn.sync, step.deadline, exc)
        raise


async def _run_bounded_async(step: Step, conn: AsyncConnection, deadline: float) -> Any:
    """``_run_bounded`` on asyncio: the bound is an ``asyncio.timeout``; where
    there is no asyncio client the step runs on a worker (``bounds.workers``),
    whose future a clean-up follows. Bounded by the budget even where the
    client's own socket timeout is shorter: that bounds each round trip, not
    a new connection's set-up (several of them) nor a ``NOSCRIPT`` reload."""
    remaining = deadline - time.monotonic()
    bound = bounds.siblings.get(conn.sync, remaining)
    seconds = bound.seconds if bound is not None else bounds.bucket(remaining)
    run: Awaitable[Any]
    if conn.aio is None:
        func, args = _sync_call(step, conn.sync, bound)
        future = _threads(step).submit(
            contextvars.copy_context().run, func, *args, server=conn.sync
        )
        run = _within(step, conn, asyncio.wrap_future(future), seconds, future)
    else:
        if isinstance(step, Call):
            run = conn.run(step.script, step.keys, step.args)
        else:
            run = conn.wait_signal(step.key, _blpop_timeout(step.timeout, bound))
        run = _within(step, conn, run, seconds)
    try:
        return await run
    except _TIMEOUTS as exc:  # the connection's own socket timeout
        _unanswered(step, conn.sync, deadline, exc)
        raise


async def _clean_up(
    step: Call, conn: AsyncConnection, after: concurrent.futures.Future[Any] | None
) -> Any:
    """Send a clean-up ``step`` (an interrupted attempt undone), waiting for
    it at most ``janitor.CLEANUP_TIMEOUT`` (and not past the acquire's deadline
    by more than ``bounds.FLOOR``); unanswered by then, it is the janitor's
    to send (after ``after``, the attempt's command still on a worker). Its
    caller has been cancelled, or is about to raise: on a hung Redis it must
    not wait for it (with no ``blocking_timeout``, for ever)."""
    seconds = janitor.CLEANUP_TIMEOUT
    if step.deadline is not None:
        seconds = min(seconds, max(bounds.FLOOR, step.deadline - time.monotonic()))
    try:
        return await _bounded(conn.run(step.script, step.keys, step.args), seconds)
    except _TIMEOUTS:
        janitor.janitor.submit(conn.sync, step, after)
        return None


async def run_async(steps: Generator[Step, Any, T], conn: AsyncConnection) -> T:
    """Run ``steps`` on asyncio; a clean-up step runs even while being cancelled,
    in the background once it has waited for Redis long enough (``_clean_up``)."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        after, error = getattr(error, "after", None), None  # what a clean-up must follow
        try:
            if isinstance(step, Call) and step.background:  # after ``after``, by the janitor
                janitor.janitor.submit(conn.sync, step, after)
                reply = None
            elif isinstance(step, Call) and step.shield:
                reply = await asyncio.shield(_clean_up(step, conn, after))
            elif step.deadline is not None:
                reply = await _run_bounded_async(step, conn, step.deadline)
            elif isinstance(step, Call):
                reply = await conn.run(step.script, step.keys, step.args)
            else:
                reply = await conn.wait_signal(step.key, step.timeout)
            if not (isinstance(step, Call) and step.shield):  # a clean-up goes on regardless
                conn.honour_lost_cancellation()
        except BaseException as exc:
            reply, error = None, exc
