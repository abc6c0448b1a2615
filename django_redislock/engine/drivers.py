"""Thin drivers that run a protocol (``engine/steps.py``) on a client.

``run`` does the steps with a synchronous redis-py client, ``run_async`` on
asyncio through an ``AsyncConnection`` (``engine/connection.py``: natively, or
in a worker thread where the topology has no asyncio client); ``Redlock``'s
quorum steps have a driver of their own beside its servers
(``primitives/redlock/fanout.py``). Each executes a step by ``perform`` (or
``perform_async``), which a primitive's first step before any protocol uses
too, so a step is executed one way, bounds included; each sends the step's
reply back into the protocol, or throws the step's exception into it, so
clean-up and error translation live in the protocol, once. A step that carries its acquire's
deadline is bounded by it even when Redis stops answering (``engine/bounds.py``);
the others run as they always did. A step that meets a full connection pool
waits for a free connection within its budget (``engine/pool.py``). A ``Wait``
blocks on no connection of its own: it joins the process's shared wake-up
connection for its server (``engine/wakeups.py``) and waits on a local event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

from django_redislock.backend import client as backend
from django_redislock.backend.scripts import WAKE
from django_redislock.engine import bounds, janitor, pool
from django_redislock.engine.connection import AsyncConnection, follow, in_thread, time_boxed
from django_redislock.engine.steps import Call, Step, Wait
from django_redislock.engine.wakeups import CONTROL_TTL_MS, AsyncWaiter, SyncWaiter, wakeups

__all__ = ["AsyncConnection", "in_thread", "perform", "perform_async", "run", "run_async"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def run(steps: Generator[Step, Any, T], client: Any) -> T:
    """Run ``steps`` on a synchronous redis-py client, each by ``perform``."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            reply, error = perform(step, client), None
        except BaseException as exc:
            reply, error = None, exc


def perform(step: Step, client: Any, first: bool = False) -> Any:
    """One step on a synchronous client, as ``run`` does each and a
    primitive's first step is done before any protocol runs
    (``LockBase._first_attempt``; ``first``, see ``_run_bounded``): a
    ``Wait`` on the shared wake-up connection, a clean-up within its budget
    (``_clean_up_sync``), any other ``Call`` bounded by its deadline
    (``_run_bounded``), and on a full pool after a wait for a free
    connection within its budget (``engine/pool.py``)."""
    if isinstance(step, Wait):
        return wait(step, client)
    if step.shield or step.background:
        return _clean_up_sync(step, client)
    return _call(step, client, first)


def _call(step: Call, client: Any, first: bool = False) -> Any:
    try:
        if step.deadline is None:
            return step.script(client, step.keys, step.args)
        return _run_bounded(step, client, step.deadline, first)
    except backend.BACKEND_ERRORS as exc:
        if not backend.pool_exhausted(exc):
            raise
        return _when_free(step, client)
    finally:
        if pool.gates.waiting:
            pool.gates.freed(client)


def _clean_up_sync(step: Call, client: Any) -> Any:
    """A clean-up ``step`` (leaving the queue, an interrupted attempt undone),
    sent at once within what is left of its budget; unanswered by then, it is
    the janitor's (``_unanswered`` hands it over once the deadline passed),
    and the acquire goes on to its outcome, as on asyncio (``_clean_up``).
    A ``background`` step, or one with no time left before its acquire's
    bound (``bounds.step_limit``: sent now, it would hold its caller past the
    bound), is the janitor's at once, sent after ``step.after``."""
    if step.background or (step.deadline is not None and bounds.step_limit(step.deadline) <= 0):
        janitor.janitor.submit(client, step, step.after)
        return None
    try:
        return _call(step, client)
    except backend.TIMEOUTS as exc:
        if not isinstance(exc, backend.Unanswered):  # not handed over yet
            janitor.janitor.submit(client, step, getattr(exc, "after", None) or step.after)
        return None


def _pool_until(deadline: float) -> float:
    """Until when a step waits for a free connection: its deadline, or for a
    step sent later (leaving the queue) the floor from now, and never past
    ``bounds.end_of``: the step still has to run after the wait."""
    return min(max(deadline, time.monotonic() + bounds.FLOOR), bounds.end_of(deadline))


def _when_free(step: Call, client: Any) -> Any:
    """``step``, sent once a connection of the pool is free: by its deadline
    (``_pool_until``), else ``PoolExhausted``; a step with no deadline waits
    ``pool.PATIENCE``. The step itself is still bounded by the acquire's
    deadline, not by the end of the wait."""
    deadline = step.deadline
    if deadline is None:
        return pool.call(client, None, step.script, client, step.keys, step.args)
    try:
        return pool.call(client, _pool_until(deadline), _run_bounded, step, client, deadline)
    except backend.PoolExhausted:
        pool.log_refused(client)
        raise


def wait(step: Wait, client: Any) -> Any:
    """A ``Wait`` on the process's shared wake-up connection for ``client``'s
    server (``engine/wakeups.py``): the signal, or ``None`` once ``step.timeout``
    passed. A waiter whose key the ``BLPOP`` under way does not list nudges it,
    best effort: its key joins the next ``BLPOP`` anyway, and every wait ends
    in a re-check."""
    end = time.monotonic() + step.timeout
    waiter = SyncWaiter(backend.as_text(step.key))
    waker, nudge = wakeups.join(client, waiter)
    try:
        if nudge:
            nudge_in_background(client, waker.control)
        waiter.wait(end - time.monotonic())
    finally:
        signal = waker.leave(waiter)
    return signal


#: How long a nudge waits for a free connection of a full pool: past that the
#: waker's next ``BLPOP`` (at most a chunk away) lists the key anyway.
NUDGE_PATIENCE = 1.0


def nudge_in_background(client: Any, control: str) -> None:
    """Send the nudge (``WAKE``) from a worker thread, never waited for: on a
    paused or slow Redis a nudge the waiter waited for would spend the budget
    its re-check needs, and the acquire would overrun its bound. Best effort:
    a nudge that fails costs its waiter a later wake-up, never a lost one."""
    try:
        bounds.workers.submit(_nudge, client, control, server=client)
    except RuntimeError as exc:  # no thread can start: the next BLPOP lists the key
        logger.debug("Could not nudge the shared wake-up connection: %s", exc)


def _nudge(client: Any, control: str) -> None:
    try:
        until = time.monotonic() + NUDGE_PATIENCE
        pool.call(client, until, WAKE, client, (control,), (CONTROL_TTL_MS,))
    except backend.BACKEND_ERRORS as exc:
        logger.debug("Could not nudge the shared wake-up connection: %s", exc)


def _unanswered(step: Step, client: Any, deadline: float, exc: BaseException) -> None:
    """Raise ``Unanswered`` for a timeout once the acquire's deadline passed;
    a clean-up that went unanswered is handed to the janitor."""
    if isinstance(exc, backend.Unanswered) or time.monotonic() < deadline:
        return
    after = getattr(exc, "after", None)  # bounds.Abandoned: a worker's command
    if isinstance(step, Call) and step.shield:
        janitor.janitor.submit(client, step, after)
    raise backend.Unanswered(f"no answer within the blocking timeout: {exc}", after) from exc


def _run_bounded(step: Call, client: Any, deadline: float, first: bool = False) -> Any:
    """Run ``step`` so that it ends within ``bounds.step_limit`` even on a hung
    Redis, or on a slow one where it must set up a connection first
    (``must_connect``: each round trip of that is under the socket timeout,
    all of them under no bound): in this thread where the client's own socket
    timeout bounds every round trip the step may take (``Limits.fits``), else
    on a worker thread waited for at most the limit. With no time left it is
    not sent: a ``TimeoutError``, ``Unanswered`` by then.

    An acquire's ``first`` step (its plain ``SET``) stays in this thread where
    the socket timeout ends it by ``bounds.end_of(deadline)``, as late as a
    step sent at the deadline may end: nothing was sent before it, and no
    step after it outlasts that either. So ``blocking_timeout=5`` on redis-py
    8's default 5 s socket timeout sends its ``SET`` from the caller's thread,
    not from a worker (a thread hop per acquire, a third more CPU a cycle)."""
    seconds = bounds.step_limit(deadline)
    try:
        if seconds <= 0:
            raise TimeoutError(f"no time left for {step.script!r} before the acquire's bound")
        trips = getattr(step.script, "round_trips", 1)
        limit = bounds.end_of(deadline) - time.monotonic() if first else seconds
        if bounds.limits.fits(client, limit, trips) and not bounds.must_connect(client):
            # the common case: the client's own socket timeout bounds the command
            return step.script(client, step.keys, step.args)
        # the caller's context: a tracer's span of the command keeps its parent
        run = contextvars.copy_context().run
        return bounds.workers.call(
            seconds, run, step.script, client, step.keys, step.args, server=client
        )
    except backend.TIMEOUTS as exc:
        _unanswered(step, client, deadline, exc)
        raise


async def _within(
    step: Call,
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
    bounded = time_boxed(run, seconds)
    if future is not None:
        bounded = follow(bounded, future)
    try:
        try:
            return await bounded
        except backend.TIMEOUTS as exc:
            if future is None:
                raise
            raise bounds.abandoned(future, seconds) from exc
    except backend.TIMEOUTS as exc:
        _unanswered(step, conn.sync, step.deadline, exc)
        raise


async def _run_bounded_async(step: Call, conn: AsyncConnection, deadline: float) -> Any:
    """``_run_bounded`` on asyncio: the bound is an ``asyncio.timeout``; where
    there is no asyncio client the step runs on a worker (``bounds.workers``),
    whose future a clean-up follows. Bounded by the budget even where the
    client's own socket timeout is shorter: that bounds each round trip, not
    a new connection's set-up (several of them) nor a ``NOSCRIPT`` reload.
    A slot of the mirror pool is waited for first, outside the bound: a full
    pool is no Redis that does not answer (``AsyncConnection.take``)."""
    if conn.aio is None:
        _time_left(step, conn, deadline)
        # bounded here, so not again on the worker; a full sync pool is waited for
        func = functools.partial(pool.call, conn.sync, _pool_until(deadline), step.script,
                                 conn.sync, step.keys, step.args)  # fmt: skip
        future = bounds.workers.submit(contextvars.copy_context().run, func, server=conn.sync)
        seconds = bounds.step_limit(deadline)  # a worker slow to start took its time out of it
        run: Awaitable[Any] = _within(step, conn, asyncio.wrap_future(future), seconds, future)
        return await run
    await conn.take(_pool_until(deadline))
    try:
        seconds = _time_left(step, conn, deadline)
        run = _within(step, conn, conn.run(step.script, step.keys, step.args), seconds)
        try:
            return await run
        except backend.TIMEOUTS as exc:  # the connection's own socket timeout
            _unanswered(step, conn.sync, deadline, exc)
            raise
    finally:
        conn.give_back()


def _time_left(step: Call, conn: AsyncConnection, deadline: float) -> float:
    """``bounds.step_limit``; with no time left the step is not sent (``_run_bounded``)."""
    seconds = bounds.step_limit(deadline)
    if seconds <= 0:
        exc = TimeoutError(f"no time left for {step.script!r} before the acquire's bound")
        _unanswered(step, conn.sync, deadline, exc)  # past the deadline: raises Unanswered
        raise exc
    return seconds


async def _clean_up(step: Call, conn: AsyncConnection) -> Any:
    """Send a clean-up ``step`` (an interrupted attempt undone), waiting for
    it at most ``janitor.CLEANUP_TIMEOUT`` (and not past the acquire's deadline
    by more than ``bounds.FLOOR``); unanswered by then, it is the janitor's
    to send (after ``step.after``, the attempt's command still on a worker). Its
    caller has been cancelled, or is about to raise: on a hung Redis it must
    not wait for it (with no ``blocking_timeout``, for ever), nor past the
    acquire's bound (``bounds.step_limit``; with no time left, not at all)."""
    seconds = janitor.CLEANUP_TIMEOUT
    if step.deadline is not None:
        seconds = min(seconds, bounds.step_limit(step.deadline))
    if seconds <= 0:
        janitor.janitor.submit(conn.sync, step, step.after)
        return None
    try:
        return await time_boxed(conn.send(step.script, step.keys, step.args), seconds)
    except backend.TIMEOUTS:
        janitor.janitor.submit(conn.sync, step, step.after)
        return None


async def wait_async(step: Wait, conn: AsyncConnection) -> Any:
    """``wait`` on asyncio: the task waits on a future the shared wake-up
    connection's thread settles; no connection, no thread of its own."""
    end = time.monotonic() + step.timeout
    waiter = AsyncWaiter(backend.as_text(step.key))
    waker, nudge = wakeups.join(conn.sync, waiter)
    try:
        if nudge:
            nudge_in_background(conn.sync, waker.control)
        await waiter.wait(end - time.monotonic())
    finally:
        signal = waker.leave(waiter)
    return signal


async def perform_async(step: Step, conn: AsyncConnection) -> Any:
    """``perform`` on asyncio, as ``run_async`` does each step and an asyncio
    primitive's first step is done: a clean-up runs even while its caller is
    being cancelled, in the background once it has waited for Redis long
    enough (``_clean_up``); after any other step a cancellation redis.asyncio
    lost is honoured (``AsyncConnection.honour_lost_cancellation``)."""
    if isinstance(step, Wait):
        reply = await wait_async(step, conn)
    elif step.background:  # after ``step.after``, by the janitor
        janitor.janitor.submit(conn.sync, step, step.after)
        if step.shield:  # a clean-up: a cancellation changes nothing
            return None
        reply = None
    elif step.shield:  # a clean-up goes on regardless of a cancellation
        return await asyncio.shield(_clean_up(step, conn))
    elif step.deadline is not None:
        reply = await _run_bounded_async(step, conn, step.deadline)
    else:
        reply = await conn.send(step.script, step.keys, step.args)
    conn.honour_lost_cancellation()
    return reply


async def run_async(steps: Generator[Step, Any, T], conn: AsyncConnection) -> T:
    """Run ``steps`` on asyncio, each by ``perform_async``."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            reply, error = await perform_async(step, conn), None
        except BaseException as exc:
            reply, error = None, exc
