"""Redlock's quorum acquire as protocol steps, driven by hand: no Redis, no threads."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import redis

from django_redislock import LockBackendError
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE
from django_redislock.engine.steps import HELD, REFUSED, Call, FanOut, Outcome, Pause, QuorumStep
from django_redislock.primitives.redlock.quorum import QuorumAttempt, acquire, retry_after

GRANTED = [7, 9, 8]  # fencing counters: held
REFUSED_FOR = -2 - 2000  # refused, the holder's lease ends in 2 s (lock_acquire.lua)


def attempt(count: int = 5, deadline: float | None = None) -> QuorumAttempt:
    return QuorumAttempt(
        name="q",
        call=Call(LOCK_ACQUIRE, ["k"], ["t"]),
        undo=Call(LOCK_RELEASE, ["k"], ["t"]),
        count=count,
        lease=10.0,
        deadline=deadline,
    )


def step(steps: Generator[QuorumStep, Any, Outcome], reply: Any) -> QuorumStep | Outcome:
    try:
        return steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def test_a_majority_granted_is_held_with_the_largest_counter() -> None:
    steps = acquire(attempt())
    first = next(steps)
    assert isinstance(first, FanOut) and first.call.script is LOCK_ACQUIRE and first.only is None
    failed = redis.ConnectionError("down")
    outcome = step(steps, [*GRANTED, failed, REFUSED_FOR])
    assert isinstance(outcome, Outcome)
    assert (outcome.status, outcome.value) == (HELD, 9)


def test_a_minority_granted_is_undone_there_then_retried_then_refused() -> None:
    steps = acquire(attempt(deadline=0.0))  # the deadline has passed: one attempt
    next(steps)
    undo = step(steps, [5, 6, REFUSED_FOR, REFUSED_FOR, REFUSED_FOR])
    assert isinstance(undo, FanOut)
    assert undo.call.script is LOCK_RELEASE and undo.only == (0, 1)
    outcome = step(steps, [0, 0, None, None, None])
    assert isinstance(outcome, Outcome)
    assert outcome.status == REFUSED
    assert outcome.value == 2000  # one more free server is needed: the first lease to end


def test_a_waiting_attempt_pauses_between_attempts() -> None:
    steps = acquire(attempt(deadline=None))
    next(steps)
    pause = step(steps, [REFUSED_FOR] * 5)  # nothing granted: nothing to undo
    assert isinstance(pause, Pause) and 0 <= pause.seconds <= 2.0
    again = step(steps, None)
    assert isinstance(again, FanOut) and again.call.script is LOCK_ACQUIRE


def test_too_few_answers_is_a_backend_error_after_undoing() -> None:
    steps = acquire(attempt())
    next(steps)
    failed = redis.ConnectionError("down")
    undo = step(steps, [5, failed, failed, failed, REFUSED_FOR])
    assert isinstance(undo, FanOut) and undo.only == (0, 1, 2, 3)
    with pytest.raises(LockBackendError, match=r"only 2 of 5"):
        steps.send([0, failed, failed, failed, None])


def test_an_interrupted_attempt_is_undone_everywhere() -> None:
    steps = acquire(attempt(count=3))
    next(steps)
    undo = steps.throw(KeyboardInterrupt())
    assert isinstance(undo, FanOut) and undo.only == (0, 1, 2)
    with pytest.raises(KeyboardInterrupt):
        steps.send([0, 0, 0])


def test_retry_after_is_when_enough_leases_end() -> None:
    # 5 servers, majority 3: one free, so the 2nd-shortest of four leases must end
    replies = [None, (REFUSED, 100), (REFUSED, 400), (REFUSED, 300), (REFUSED, 200)]
    assert retry_after(replies, 3) == 0.2
    assert retry_after([None, None, None], 2) == 0.0
