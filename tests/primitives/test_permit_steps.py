"""A ``Semaphore``'s acquire steps (``PermitBase._acquire_steps``) and release,
fed canned replies as ``test_lock_steps.py`` feeds a ``Lock``'s: the permit
script's call (its member as an unfenced grant writes it), the wait, the
limit mismatch, the clean-up of an interrupted attempt, and the release.
The ``Semaphore`` is real; no command reaches Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import LockBackendError, LockLostError, Semaphore
from django_redislock.backend.scripts import PERMIT_CANCEL, PERMIT_RELEASE, SEMAPHORE_ACQUIRE
from django_redislock.engine.steps import HELD_RESULT, AcquireResult, Wait
from tests.support.steps import (
    T0,
    WALL_T0,
    Clock,
    Done,
    assert_call,
    named,
    send,
    throw,
    use_clock,
)

#: Where a Semaphore's acquire and release read the time.
CLOCKED = (
    "django_redislock.engine.steps",
    "django_redislock.primitives.permits",
    "django_redislock.primitives.sync_permits",
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    with override_settings(REDISLOCK={"STATS": False}):
        yield use_clock(monkeypatch, *CLOCKED)


@pytest.fixture
def sem(clock: Clock) -> Iterator[Semaphore]:
    sem = Semaphore("steps:sem", 3, auto_renew=False, timeout=30, blocking_timeout=5)
    yield sem
    for holding in sem._stack():
        holding.end()
    sem._stack().clear()


def test_the_attempt_sends_the_member_an_unfenced_grant_writes(sem: Semaphore) -> None:
    gen = sem._acquire_steps(None, None)
    call = next(gen)
    resolved = sem._resolve()
    assert_call(call, SEMAPHORE_ACQUIRE, keys=resolved.keys_for(SEMAPHORE_ACQUIRE),
                deadline=T0 + 5)  # fmt: skip
    args = named(call)
    token, fence, limit, since, holder = args["member"].split(":", 4)
    assert (fence, limit, int(since)) == ("0", "3", int(WALL_T0 * 1000))
    assert token and holder
    assert (args["lease_ms"], args["fenced"]) == (30000, 0)
    assert args["wait_ms"] > 0  # it may queue
    assert send(gen, 6) == Done(HELD_RESULT)  # the bare fencing token of a grant
    (holding,) = sem._stack()
    assert holding.token == f"{token}:6:3:{since}:{holder}"
    assert holding.release_args == PERMIT_RELEASE.args_of(member=holding.token)


def test_a_try_never_queues(sem: Semaphore) -> None:
    gen = sem._acquire_steps(False, None)
    assert named(next(gen))["wait_ms"] < 0
    assert send(gen, [0, 700]) == Done(AcquireResult(False, 0.7))
    assert sem._stack() == []


def test_refused_then_woken_sends_the_same_attempt_again(sem: Semaphore, clock: Clock) -> None:
    gen = sem._acquire_steps(None, None)
    call = next(gen)
    token = named(call)["member"].split(":", 1)[0]
    wait = send(gen, [0, 1200])
    assert wait == Wait(sem._resolve().sigprefix + token, 1.2, T0 + 5)
    clock.advance(1.0)
    again = send(gen, (wait.key, b"1"))
    assert_call(again, SEMAPHORE_ACQUIRE, args=call.args, deadline=T0 + 5)
    assert send(gen, [1, 0]) == Done(HELD_RESULT)  # no fencing token taken yet
    (holding,) = sem._stack()
    assert holding.fencing_token == 0


def test_a_limit_mismatch_leaves_the_queue_then_says_which_limit(sem: Semaphore) -> None:
    gen = sem._acquire_steps(None, None)
    token = named(next(gen))["member"].split(":", 1)[0]
    assert isinstance(send(gen, [0, 1000]), Wait)
    send(gen, None)
    leave = send(gen, [-2, 5])  # LIMIT_MISMATCH: the name is in use with limit=5
    assert_call(leave, PERMIT_CANCEL, args=PERMIT_CANCEL.args_of(token=token, limit=3),
                deadline=T0 + 5, shield=True)  # fmt: skip
    with pytest.raises(ValueError, match="limit=5"):
        send(gen, 1)


@pytest.mark.parametrize("error", [redis.ConnectionError("lost"), KeyboardInterrupt()])
def test_an_interrupted_attempt_gives_back_what_it_may_have_been_granted(
    sem: Semaphore, error: BaseException
) -> None:
    gen = sem._acquire_steps(None, None)
    token = named(next(gen))["member"].split(":", 1)[0]
    cancel = throw(gen, error)
    assert_call(cancel, PERMIT_CANCEL, args=PERMIT_CANCEL.args_of(token=token, limit=3),
                shield=True, background=isinstance(error, redis.ConnectionError))  # fmt: skip
    with pytest.raises(LockBackendError if isinstance(error, Exception) else KeyboardInterrupt):
        send(gen, 1)
    assert sem._stack() == []


class Wire:
    """The release's one command, answered from ``replies``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replies: list[Any] = []
        self.sent: list[tuple[Any, list[Any]]] = []
        monkeypatch.setattr(
            "django_redislock.primitives.sync_permits.pool", SimpleNamespace(send=self.send)
        )

    def send(self, script: Any, client: Any, keys: Any, args: Any) -> Any:
        self.sent.append((script, list(args)))
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


def _held(sem: Semaphore) -> Any:
    gen = sem._acquire_steps(None, None)
    next(gen)
    send(gen, 4)
    return sem._stack()[-1]


@pytest.mark.parametrize(
    ("reply", "raised"),
    [(1, None), (0, LockLostError), (redis.ConnectionError("down"), LockBackendError)],
)
def test_the_release(
    sem: Semaphore, monkeypatch: pytest.MonkeyPatch, reply: Any, raised: type | None
) -> None:
    wire = Wire(monkeypatch)
    holding = _held(sem)
    wire.replies.append(reply)
    if raised is None:
        sem.release()
    else:
        with pytest.raises(raised):
            sem.release()
    assert wire.sent == [(PERMIT_RELEASE, PERMIT_RELEASE.args_of(member=holding.token))]
    assert sem._stack() == [] and not holding.active
