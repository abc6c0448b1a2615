"""An interrupted or failed acquire (``engine/steps.py``), driven by hand as
``test_steps.py`` drives the outcomes: the exception a step raised is thrown
into the protocol, which must send the attempt's clean-up (shielded, in the
background when Redis may still be running the attempt) and then raise the
right error. Timeline of each case: attempt sent -> Redis may have granted
or queued it -> the reply is lost, the caller interrupted, or the pool full.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_CANCEL
from django_redislock.engine.steps import (
    REFUSED,
    Call,
    Outcome,
    acquire,
    interrupted,
    single,
)
from django_redislock.exceptions import (
    LockBackendError,
    LockBackendTimeout,
    LockPoolExhausted,
)
from tests.support.steps import (
    KEYS,
    LEAVE,
    T0,
    Clock,
    Done,
    assert_call,
    attempt,
    queued,
    refused,
    send,
    throw,
    use_clock,
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return use_clock(monkeypatch, "django_redislock.engine.steps")


@pytest.mark.parametrize(
    ("error", "background"),
    [
        (redis.ConnectionError("reply lost"), True),  # dropped: a new connection's set-up
        (redis.TimeoutError("reply lost"), True),
        (OSError("reset"), True),
        (redis.ResponseError("ERR script"), False),  # Redis answered: at once
    ],
)
def test_a_lost_reply_cleans_up_then_raises_a_backend_error(
    clock: Clock, error: Exception, background: bool
) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    next(gen)
    cleanup = throw(gen, error)
    assert_call(cleanup, LOCK_CANCEL, args=["t1"], deadline=T0 + 5, shield=True,
                background=background)  # fmt: skip
    with pytest.raises(LockBackendError) as raised:
        send(gen, 1)
    assert raised.value.__cause__ is error
    assert raised.value.name == "q"


def test_a_clean_up_that_fails_too_raises_the_first_error(clock: Clock) -> None:
    gen = acquire(attempt())
    next(gen)
    first = redis.ConnectionError("reply lost")
    throw(gen, first)
    with pytest.raises(LockBackendError) as raised:
        throw(gen, redis.ConnectionError("still down"))
    assert raised.value.__cause__ is first


def _to_the_leave(gen: Any, clock: Clock) -> Call:
    queued(gen)
    clock.advance(5)
    send(gen, None)
    leave = send(gen, refused(2000))
    assert isinstance(leave, Call)
    return leave


@pytest.mark.parametrize("where", ["attempt", "wait", "recheck", "leave"])
def test_a_backend_error_at_each_step_cleans_up_then_raises(clock: Clock, where: str) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    if where == "attempt":
        next(gen)
    elif where == "wait":
        queued(gen)
    elif where == "recheck":
        queued(gen)
        send(gen, None)
    else:
        _to_the_leave(gen, clock)
    assert_call(throw(gen, redis.ResponseError("ERR")), LOCK_CANCEL, shield=True)
    with pytest.raises(LockBackendError):
        send(gen, 1)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, asyncio.CancelledError])
@pytest.mark.parametrize("where", ["attempt", "wait"])
def test_an_interruption_undoes_the_attempt_then_is_raised(
    clock: Clock, interrupt: type[BaseException], where: str
) -> None:
    """Thrown at the attempt, the grant may be Redis's and not the caller's
    yet; thrown in the wait, a handoff may be on its way: the undo passes it on."""
    gen = acquire(attempt(deadline=T0 + 5))
    if where == "attempt":
        next(gen)
    else:
        queued(gen)
    error = interrupt()
    undo = throw(gen, error)
    assert_call(undo, LOCK_CANCEL, args=["t1"], deadline=T0 + 5, shield=True, background=False)
    with pytest.raises(interrupt) as raised:
        send(gen, 1)
    assert raised.value is error


def test_a_cancellation_of_a_command_still_on_a_worker_cleans_up_after_it(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    next(gen)
    error = asyncio.CancelledError()
    error.after = object()  # type: ignore[attr-defined]  # drivers.follow: the worker's future
    cleanup = throw(gen, error)
    assert_call(cleanup, LOCK_CANCEL, shield=True, background=True)
    assert cleanup.after is error.after  # the janitor sends it after the worker's command


def test_unanswered_is_a_backend_timeout_cleaned_up_in_the_background(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    queued(gen)
    send(gen, None)
    cleanup = throw(gen, backend.Unanswered("no answer within the blocking timeout"))
    assert_call(cleanup, LOCK_CANCEL, deadline=T0 + 5, shield=True, background=True)
    with pytest.raises(LockBackendTimeout):
        send(gen, None)


def test_a_full_pool_at_the_first_attempt_is_refused_with_nothing_to_undo(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    next(gen)
    assert throw(gen, backend.PoolExhausted("full", 10)) == Done(Outcome(REFUSED, 0, T0))


def test_a_full_pool_while_queued_leaves_in_the_background_then_is_refused(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    queued(gen)
    clock.advance(2.0)
    send(gen, None)
    leave = throw(gen, backend.PoolExhausted("full", 10))
    assert_call(leave, LOCK_CANCEL, args=["t1"], deadline=T0 + 5, shield=True, background=True)
    assert send(gen, None) == Done(Outcome(REFUSED, 0, T0 + 2.0, waited=True))


def test_a_full_pool_with_no_deadline_is_lock_pool_exhausted(clock: Clock) -> None:
    gen = acquire(attempt(deadline=None))
    queued(gen)
    send(gen, None)
    cause = backend.PoolExhausted("full", 10)
    with pytest.raises(LockPoolExhausted) as raised:
        throw(gen, cause)
    assert raised.value.max_connections == 10
    assert raised.value.__cause__ is cause


def test_closing_a_waiting_acquire_sends_nothing(clock: Clock) -> None:
    gen = acquire(attempt())
    queued(gen)
    gen.close()  # a driver dropped: GeneratorExit is not an interruption to clean up


# --- interrupted and single, on their own ------------------------------------------------


def test_interrupted_without_a_clean_up_raises_at_once() -> None:
    gen = interrupted("q", None, None, redis.ConnectionError("down"))
    with pytest.raises(LockBackendError):
        next(gen)


def test_interrupted_raises_another_error_as_it_is() -> None:
    error = ValueError("a bug")
    gen = interrupted("q", LEAVE, T0, error)
    assert_call(next(gen), LOCK_CANCEL, deadline=T0, shield=True, background=False)
    with pytest.raises(ValueError, match="a bug") as raised:
        send(gen, 1)
    assert raised.value is error


def test_single_returns_the_reply() -> None:
    call = Call(LOCK_ACQUIRE, KEYS, ["t1"])
    gen = single(call, "q")
    assert next(gen) is call
    assert send(gen, 5) == Done(5)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (backend.Unanswered("late"), LockBackendTimeout),
        (redis.ConnectionError("down"), LockBackendError),
        (backend.PoolExhausted("full", 3), LockPoolExhausted),
        (KeyboardInterrupt(), KeyboardInterrupt),
    ],
)
def test_single_translates_backend_errors(error: BaseException, raised: type) -> None:
    gen = single(Call(LOCK_ACQUIRE, KEYS, ["t1"]), "q")
    next(gen)
    with pytest.raises(raised):
        throw(gen, error)
