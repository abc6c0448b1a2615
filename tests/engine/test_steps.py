"""The fair acquire (``engine/steps.py``) driven by hand, as h11 tests its state
machine: each test sends the protocol canned replies, or throws it a step's
exception, and asserts the next step and the outcome. No Redis, no driver,
no threads; the clock is the test's (``Clock``), so no test sleeps.

The real-server tests (``tests/primitives``, ``tests/engine/test_waits.py``)
stay: they pin the scripts and the drivers; these pin every branch of the
one loop that ``Lock``, ``AsyncLock`` and the permits share.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_CANCEL, SEMAPHORE_ACQUIRE
from django_redislock.engine.steps import (
    HANDED,
    HELD,
    LIMIT_MISMATCH,
    NOT_OURS,
    REFUSED,
    SLOW_ROUND_TRIP,
    Call,
    Outcome,
    Wait,
    acquire,
    acquire_reply,
    bounded,
    handoff_fresh,
    permit_reply,
    refusal_holder,
    wait_seconds,
)
from tests.support.steps import (
    KEYS,
    SIGNAL,
    T0,
    Clock,
    Done,
    assert_call,
    attempt,
    queued,
    refused,
    send,
    use_clock,
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return use_clock(monkeypatch, "django_redislock.engine.steps")


# --- the acquire, branch by branch ---------------------------------------------------------


def test_granted_at_once(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    assert_call(next(gen), LOCK_ACQUIRE, args=["t1", "wait"], deadline=T0 + 5)
    assert send(gen, 7) == Done(Outcome(HELD, 7, T0, waited=False))


def test_granted_with_no_fencing_token_taken_yet(clock: Clock) -> None:
    gen = acquire(attempt())
    assert_call(next(gen), LOCK_ACQUIRE, deadline=None)
    assert send(gen, -1) == Done(Outcome(HELD, 0, T0))  # taken on first use


def test_refused_and_queued_waits_on_its_signal_for_the_hint(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    assert queued(gen, hint_ms=1500) == Wait(SIGNAL, 1.5, T0 + 5)  # the holder's lease ends first


def test_queued_then_handed_over_holds_with_the_handoffs_fencing_token(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5, handoff_lease=3.0))
    queued(gen)
    clock.advance(1.0)  # a third of the first lease: fresh
    assert send(gen, (SIGNAL, b"42")) == Done(Outcome(HANDED, 42, T0, waited=True))


@pytest.mark.parametrize("wake_up", [b"1", "1"])  # a client with decode_responses sends str
def test_queued_then_woken_then_granted_on_the_recheck(clock: Clock, wake_up: Any) -> None:
    gen = acquire(attempt(deadline=T0 + 5, handoff_lease=3.0))
    queued(gen)
    clock.advance(0.5)
    recheck = send(gen, (SIGNAL, wake_up))  # a plain wake-up is no handoff, whatever its lease
    assert_call(recheck, LOCK_ACQUIRE, args=["t1", "wait", 1], deadline=T0 + 5)
    assert send(gen, 9) == Done(Outcome(HELD, 9, T0 + 0.5, waited=True))


def test_freed_meanwhile_a_wait_that_times_out_rechecks_and_is_granted(clock: Clock) -> None:
    gen = acquire(attempt())
    assert queued(gen) == Wait(SIGNAL, 2.0, None)  # no deadline: the chunk bounds it
    clock.advance(2.0)
    assert_call(send(gen, None), LOCK_ACQUIRE, args=["t1", "wait", 1], deadline=None)
    assert send(gen, 11) == Done(Outcome(HELD, 11, T0 + 2.0, waited=True))


def test_a_lapsed_lease_taken_by_a_newcomer_queues_again(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 10))
    queued(gen)
    clock.advance(2.0)
    assert_call(send(gen, (SIGNAL, b"1")), LOCK_ACQUIRE, args=["t1", "wait", 1])
    again = send(gen, refused(800))  # someone else took it meanwhile
    assert again == Wait(SIGNAL, 0.8, T0 + 10)
    clock.advance(0.8)
    assert_call(send(gen, None), LOCK_ACQUIRE, args=["t1", "wait", 2])
    assert send(gen, 12) == Done(Outcome(HELD, 12, T0 + 2.8, waited=True))


def test_a_stale_handoff_is_checked_by_another_attempt(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 10, handoff_lease=1.0))
    queued(gen)
    clock.advance(0.8)  # past three quarters of its first lease: not believed
    assert_call(send(gen, (SIGNAL, b"42")), LOCK_ACQUIRE, args=["t1", "wait", 1])
    assert send(gen, 42) == Done(Outcome(HELD, 42, T0 + 0.8, waited=True))  # still ours


def test_a_handoff_without_a_first_lease_is_a_wake_up(clock: Clock) -> None:
    """No watchdog (``handoff_lease`` 0): the next attempt sets the full lease."""
    gen = acquire(attempt(handoff_lease=0.0))
    queued(gen)
    assert_call(send(gen, (SIGNAL, b"42")), LOCK_ACQUIRE, args=["t1", "wait", 1])


def test_without_on_wait_the_recheck_sends_the_attempt_again(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5, recheck=False))  # a permit's attempt
    queued(gen)
    assert_call(send(gen, None), LOCK_ACQUIRE, args=["t1", "wait"], deadline=T0 + 5)


def test_a_try_is_refused_without_waiting_or_leaving(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5, may_wait=False))
    next(gen)
    assert send(gen, refused(300)) == Done(Outcome(REFUSED, 300, T0))


def test_timeout_the_deadline_spent_leaves_the_queue_then_is_refused(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 5))
    assert queued(gen).timeout == 2.0
    clock.advance(2.0)
    send(gen, None)
    assert send(gen, refused(2000)) == Wait(SIGNAL, 2.0, T0 + 5)
    clock.advance(3.0)  # the deadline
    assert_call(send(gen, None), LOCK_ACQUIRE, deadline=T0 + 5)
    leave = send(gen, refused(2000))
    # a clean-up (shield): the driver gives it to the janitor when no time is left for it
    assert_call(leave, LOCK_CANCEL, args=["t1"], deadline=T0 + 5, shield=True, background=False)
    assert send(gen, 1) == Done(Outcome(REFUSED, 2000, T0 + 5, waited=True))


def test_a_deadline_already_spent_leaves_at_once(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0))
    next(gen)
    assert_call(send(gen, refused(2000)), LOCK_CANCEL, deadline=T0, shield=True)
    assert send(gen, 1) == Done(Outcome(REFUSED, 2000, T0, waited=False))


def test_a_slow_redis_shortens_the_wait_then_leaves_in_the_background(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 1))
    next(gen)
    clock.advance(0.3)  # a slow round trip: planned for twice (its answer, the re-check)
    wait = send(gen, refused(2000))
    assert isinstance(wait, Wait)
    assert wait.timeout == pytest.approx(1 - 0.3 - 2 * 0.3)
    clock.advance(wait.timeout)
    send(gen, None)
    clock.advance(0.3)
    leave = send(gen, refused(2000))  # no round trip fits in what is left
    assert_call(leave, LOCK_CANCEL, deadline=T0 + 1, shield=True, background=True)
    assert isinstance(send(gen, None), Done)


def test_a_fast_round_trip_is_not_planned_for(clock: Clock) -> None:
    gen = acquire(attempt(deadline=T0 + 1))
    next(gen)
    clock.advance(SLOW_ROUND_TRIP / 2)  # jitter: the wait is not cut short for it
    wait = send(gen, refused(2000))
    assert wait == Wait(SIGNAL, pytest.approx(1 - SLOW_ROUND_TRIP / 2), T0 + 1)


def test_another_status_while_queued_leaves_the_queue(clock: Clock) -> None:
    permit = attempt(deadline=T0 + 5)
    permit.parse = permit_reply
    gen = acquire(permit)
    next(gen)
    assert isinstance(send(gen, [REFUSED, 500]), Wait)
    send(gen, None)
    assert_call(send(gen, [LIMIT_MISMATCH, 3]), LOCK_CANCEL, deadline=T0 + 5, shield=True)
    assert send(gen, 1) == Done(Outcome(LIMIT_MISMATCH, 3, T0, waited=True))


def test_another_status_at_once_needs_no_leave(clock: Clock) -> None:
    gen = acquire(attempt())
    next(gen)
    assert send(gen, 0) == Done(Outcome(NOT_OURS, 0, T0))


# --- the helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint_ms", "chunk", "deadline", "round_trip", "expected"),
    [
        (0, 2.0, None, 0.0, 2.0),  # no hint: the chunk
        (500, 2.0, None, 0.0, 0.5),  # the holder's lease ends sooner
        (5000, 2.0, None, 0.0, 2.0),
        (5000, 2.0, T0 + 1.0, 0.0, 1.0),  # the deadline
        (5000, 2.0, T0 + 1.0, 0.2, 0.6),  # room for the answer and the re-check
        (5000, 2.0, T0 - 1.0, 0.0, backend.MIN_WAIT_CHUNK),  # never below the floor
    ],
)
def test_wait_seconds(
    clock: Clock, hint_ms: int, chunk: float, deadline: float | None, round_trip: float,
    expected: float,
) -> None:  # fmt: skip
    assert wait_seconds(hint_ms, chunk, deadline, round_trip) == pytest.approx(expected)


def test_handoff_fresh(clock: Clock) -> None:
    assert handoff_fresh(T0, 1.0)
    clock.advance(0.74)
    assert handoff_fresh(T0, 1.0)
    clock.advance(0.01)
    assert not handoff_fresh(T0, 1.0)  # a quarter of the first lease left: re-check
    assert not handoff_fresh(clock.now, 0.0)  # no first lease: only a wake-up


@pytest.mark.parametrize(
    ("reply", "expected"),
    [(7, (HELD, 7)), (-1, (HELD, 0)), (0, (NOT_OURS, 0)), (-2, (REFUSED, 0)),
     (-2002, (REFUSED, 2000)), ([-2002, b"t:0:1:0:30000:0:h:1:T"], (REFUSED, 2000))],
)  # fmt: skip
def test_acquire_reply(reply: Any, expected: tuple[int, int]) -> None:
    assert acquire_reply(reply) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [(9, (HELD, 9)), ([1, 0], (HELD, 0)), ([0, 250], (REFUSED, 250)),
     ([b"-2", b"3"], (LIMIT_MISMATCH, 3))],
)  # fmt: skip
def test_permit_reply(reply: Any, expected: tuple[int, int]) -> None:
    assert permit_reply(reply) == expected


def test_bounded() -> None:
    call = Call(SEMAPHORE_ACQUIRE, KEYS, ["m"], shield=True)
    assert bounded(call, None) is call
    assert bounded(call, T0) == Call(SEMAPHORE_ACQUIRE, KEYS, ["m"], True, T0)


def test_a_refused_outcome_keeps_the_reply_that_names_the_holder(clock: Clock) -> None:
    """No step is added: the refusal's own reply is kept (out of the outcome's
    equality), and decoded only once the acquire has given up."""
    value = b"cafe0123beef:0:2:5:30000:1700000000000:web-3:4121:MainThread | POST /buy/42/"
    gen = acquire(attempt(deadline=T0 + 5, may_wait=False))
    next(gen)
    done = send(gen, [-2 - 1500, value])
    assert done == Done(Outcome(REFUSED, 1500, T0))
    assert isinstance(done, Done)
    holder = refusal_holder(done.value.refusal)
    assert holder is not None
    assert (holder.host, holder.pid, holder.thread, holder.runs) == (
        "web-3", 4121, "MainThread", "POST /buy/42/")  # fmt: skip
    assert (holder.token, holder.ttl, holder.count, holder.fencing_token) == ("cafe0123", 1.5, 2, 5)
    assert holder.since == 1_700_000_000.0
    assert holder.held_for(now=1_700_000_012.4) == pytest.approx(12.4)


@pytest.mark.parametrize(
    "reply",
    [
        None,
        7,
        -2002,
        [0, 250],
        [-2002, b"foreign"],
        [-2002, 12],
        [0, b"x", b"m"],
        [0, 250, b"m"],
        ["x", b"v"],
        [],
    ],
)
def test_a_refusal_that_names_nobody_is_none(reply: Any) -> None:
    assert refusal_holder(reply) is None


def test_a_permit_refusal_names_the_first_ending_holder() -> None:
    member = b"w0123456789abcdef:9:0:1700000000000:web-3:77:worker | task export"
    holder = refusal_holder([0, 800, member])
    assert holder is not None
    assert (holder.mode, holder.pid, holder.runs, holder.ttl) == ("write", 77, "task export", 0.8)
    assert holder.fencing_token == 9
    assert holder.token == "w0123456"
