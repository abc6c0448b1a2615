"""A ``Lock``'s own acquire steps (``LockBase._first_attempt``, then
``_after_first``) and its release, fed canned replies: the plain ``SET NX PX``
first, the contended hand-over to the fair acquire, a nested re-entry, and
each release's arguments and outcome. The ``Lock`` and its ``Resolved`` are
real (settings, keys, this thread's registry); no command reaches Redis: the test answers each step
(``send``/``throw``), and the release's one command (``pool.send``).

``auto_renew=False`` and ``STATS`` off keep the watchdog and the counters'
writer, which would talk to Redis on their own, out of it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import Lock, LockBackendError, LockLostError, LockPoolExhausted
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_CANCEL, LOCK_RELEASE, LOCK_TAKE
from django_redislock.engine.steps import HELD_RESULT, AcquireResult, Wait
from django_redislock.primitives import lock as lock_module
from django_redislock.primitives.base import Resolved
from tests.support.steps import (
    T0,
    WALL_T0,
    Clock,
    Done,
    assert_call,
    named,
    refused,
    send,
    throw,
    use_clock,
)

#: Where a Lock's acquire and release read the time.
CLOCKED = (
    "django_redislock.engine.steps",
    "django_redislock.primitives.lock_common",
    "django_redislock.primitives.first_step",
    "django_redislock.primitives.lock",
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    with override_settings(REDISLOCK={"STATS": False}):
        yield use_clock(monkeypatch, *CLOCKED)


class Wire:
    """The release's one command, answered from ``replies`` (a reply, or an
    exception to raise); what was sent is in ``sent``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replies: list[Any] = []
        self.sent: list[tuple[Any, list[Any], list[Any]]] = []
        monkeypatch.setattr(
            "django_redislock.primitives.lock.pool", SimpleNamespace(send=self.send)
        )

    def send(self, script: Any, client: Any, keys: Any, args: Any) -> Any:
        self.sent.append((script, list(keys), list(args)))
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    return Wire(monkeypatch)


@pytest.fixture
def lock(clock: Clock) -> Iterator[Lock]:
    lock = Lock("steps:sku", auto_renew=False, timeout=30)
    yield lock
    holding = lock._holding()
    while holding is not None and holding.active:  # a test that left it held
        holding.end()
        lock._handles.left(lock, holding)
        holding = lock._holding()


def acquire_steps(
    lock: Lock, resolved: Resolved, blocking: bool | None, blocking_timeout: float | None
) -> Generator[Any, Any, AcquireResult]:
    """``Lock._acquire`` with its first step yielded instead of sent
    (``drivers.perform``), so that every step is answered here."""
    first = lock._first_attempt(resolved, blocking, blocking_timeout, lock_module.time.monotonic())
    if first.take is None:
        return (yield from lock._after_first(first))
    try:
        took = yield first.take
    except GeneratorExit:  # the test is done with it
        raise
    except BaseException as error:
        return (yield from lock._after_first(first, error))
    if took:
        return lock._held_at_once(first)
    return (yield from lock._after_first(first))


def start(lock: Lock, blocking_timeout: float | None = 5.0) -> tuple[Any, Resolved]:
    resolved = lock._resolve()
    return acquire_steps(lock, resolved, True, blocking_timeout), resolved


def test_the_first_step_is_a_plain_set_of_the_unfenced_value(lock: Lock) -> None:
    gen, resolved = start(lock)
    take = next(gen)
    assert_call(take, LOCK_TAKE, keys=resolved.keys_for(LOCK_RELEASE), deadline=T0 + 5)
    value, lease_ms = take.args
    token, fence, count, fenced, lease, since, holder = value.split(":", 6)
    assert (fence, count, fenced, lease) == ("0", "1", "0", "30000")
    assert lease_ms == 30000 and int(since) == int(WALL_T0 * 1000)
    assert token and holder
    assert send(gen, True) == Done(HELD_RESULT)
    holding = lock._holding()
    assert holding is not None
    assert (holding.token, holding.fencing_token, holding.depth) == (token, 0, 1)


def test_a_set_that_finds_the_lock_taken_runs_the_acquire_script(lock: Lock, clock: Clock) -> None:
    gen, resolved = start(lock)
    token = next(gen).args[0].split(":", 1)[0]
    attempt = send(gen, None)  # SET NX: not set
    assert_call(attempt, LOCK_ACQUIRE, keys=resolved.keys_for(LOCK_ACQUIRE), deadline=T0 + 5)
    args = named(attempt)
    assert (args["token"], args["mode"], args["fenced"]) == (token, "wait", 0)
    wait = send(gen, refused(1000))
    assert wait == Wait(resolved.sigprefix + token, 1.0, T0 + 5)
    clock.advance(0.25)
    # no watchdog (auto_renew=False): a handoff is taken by the next attempt, with the full lease
    recheck = send(gen, (wait.key, b"77"))
    assert_call(recheck, LOCK_ACQUIRE, deadline=T0 + 5)
    assert named(recheck)["waited_ms"] == 250
    assert send(gen, 77) == Done(HELD_RESULT)
    holding = lock._holding()
    assert holding is not None and holding.fencing_token == 77


def test_fencing_up_front_skips_the_set(clock: Clock) -> None:
    lock = Lock("steps:fenced", auto_renew=False, fencing=True)
    gen, _ = start(lock)
    attempt = next(gen)
    assert_call(attempt, LOCK_ACQUIRE)
    assert named(attempt)["fenced"] == 1
    assert send(gen, 5) == Done(HELD_RESULT)
    holding = lock._holding()
    assert holding is not None and holding.fencing_token == 5
    holding.end()
    lock._handles.left(lock, holding)


def test_a_refused_try_is_refused_with_the_hint(lock: Lock) -> None:
    resolved = lock._resolve()
    gen = acquire_steps(lock, resolved, False, None)
    assert next(gen).deadline == T0  # a try has no budget to wait
    attempt = send(gen, None)
    assert named(attempt)["mode"] == "try"
    assert send(gen, refused(1500)) == Done(AcquireResult(False, 1.5))
    assert lock._holding() is None


@pytest.mark.parametrize("error", [redis.ConnectionError("lost"), KeyboardInterrupt()])
def test_a_set_interrupted_or_unanswered_is_cancelled_by_its_token(
    lock: Lock, error: BaseException
) -> None:
    """The SET may have been run: its token's cancel frees what it took."""
    gen, resolved = start(lock)
    token = next(gen).args[0].split(":", 1)[0]
    cancel = throw(gen, error)
    assert_call(cancel, LOCK_CANCEL, keys=resolved.keys_for(LOCK_RELEASE),
                args=LOCK_CANCEL.args_of(token=token), shield=True,
                background=isinstance(error, redis.ConnectionError))  # fmt: skip
    with pytest.raises(LockBackendError if isinstance(error, Exception) else KeyboardInterrupt):
        send(gen, 1)
    assert lock._holding() is None


def test_a_full_pool_at_the_set_is_refused_or_with_no_deadline_exhausted(lock: Lock) -> None:
    gen, _ = start(lock)
    next(gen)
    assert throw(gen, backend.PoolExhausted("full", 4)) == Done(AcquireResult(False))
    with override_settings(REDISLOCK={"STATS": False, "BLOCKING_TIMEOUT": None}):
        gen, _ = start(lock, blocking_timeout=None)
        assert next(gen).deadline is None
        with pytest.raises(LockPoolExhausted):
            throw(gen, backend.PoolExhausted("full", 4))


def _held(lock: Lock) -> Any:
    gen, _ = start(lock)
    next(gen)
    send(gen, True)
    holding = lock._holding()
    assert holding is not None
    return holding


def test_a_reentry_nests_in_one_bounded_call(lock: Lock) -> None:
    holding = _held(lock)
    gen, resolved = start(lock)
    nest = next(gen)
    assert_call(nest, LOCK_ACQUIRE, keys=resolved.keys_for(LOCK_ACQUIRE), deadline=T0 + 5)
    args = named(nest)
    assert (args["token"], args["mode"], args["lease_ms"]) == (holding.token, "nest", 30000)
    assert send(gen, -1) == Done(HELD_RESULT)
    assert holding.depth == 2


def test_a_reentry_that_finds_the_hold_gone_acquires_afresh(lock: Lock) -> None:
    holding = _held(lock)
    gen, _ = start(lock)
    next(gen)
    attempt = send(gen, 0)  # NOT_OURS: the old hold is lost, the acquire goes on, by the script
    assert_call(attempt, LOCK_ACQUIRE)
    assert holding.lost is not None
    assert named(attempt)["token"] != holding.token  # a new token
    assert send(gen, -1) == Done(HELD_RESULT)


def test_a_reentry_unanswered_is_a_backend_error(lock: Lock) -> None:
    holding = _held(lock)
    gen, _ = start(lock)
    next(gen)
    with pytest.raises(LockBackendError):
        throw(gen, redis.ConnectionError("down"))
    assert holding.depth == 1


# --- the release ----------------------------------------------------------------------------


def test_the_last_release_sends_final_and_forgets_the_hold(lock: Lock, wire: Wire) -> None:
    holding = _held(lock)
    wire.replies.append(1)
    lock.release()
    assert wire.sent == [(LOCK_RELEASE, holding.keys, LOCK_RELEASE.args_of(token=holding.token,
                                                                           final=1))]  # fmt: skip
    assert lock._holding() is None and not holding.active


def test_an_inner_release_never_frees_the_lock(lock: Lock, wire: Wire) -> None:
    holding = _held(lock)
    gen, _ = start(lock)
    next(gen)
    send(gen, -1)  # nested
    wire.replies += [1, 1]
    lock.release()
    assert wire.sent[-1][2] == LOCK_RELEASE.args_of(token=holding.token)  # no final
    assert holding.depth == 1 and holding.active
    lock.release()
    assert wire.sent[-1][2] == LOCK_RELEASE.args_of(token=holding.token, final=1)
    assert not holding.active


def test_a_release_that_finds_the_lock_gone_is_lost(lock: Lock, wire: Wire) -> None:
    holding = _held(lock)
    wire.replies.append(-1)  # NOT_OURS
    with pytest.raises(LockLostError):
        lock.release()
    assert not holding.active and lock._holding() is None


def test_a_release_unanswered_stops_renewing_and_raises(lock: Lock, wire: Wire) -> None:
    holding = _held(lock)
    wire.replies.append(redis.ConnectionError("down"))
    with pytest.raises(LockBackendError):
        lock.release()
    assert not holding.active  # the lease frees the lock


def test_an_interrupted_inner_release_leaves_its_level(lock: Lock, wire: Wire) -> None:
    holding = _held(lock)
    gen, _ = start(lock)
    next(gen)
    send(gen, -1)
    wire.replies.append(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    assert holding.depth == 1 and holding.active  # the outer release is sent as the last
