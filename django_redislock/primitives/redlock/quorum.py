"""The quorum acquire of ``Redlock``, written once and without I/O.

A Redlock is held while a majority of independent servers hold it, for the
lease less the clock-drift allowance of the algorithm (antirez, "Distributed
locks with Redis"). Like ``protocol.acquire`` for one server, the attempt is
a generator: it yields a ``protocol.FanOut`` (one script on every server at
once; the reply is one result per server, a value or the exception) or a
``protocol.Pause`` between attempts, and returns a ``protocol.Outcome``. ``fanout.run_quorum``
performs the steps through ``fanout``.

Why waiting polls: a ``Lock`` waiter sleeps on a list that the releasing
script pushes to, on the one server that decides. A Redlock has no such
server: a waiter woken by one server still needs a majority, and per-server
queues order waiters differently, so waiters would each win a minority and
livelock. Waiters therefore retry after a random, growing delay (``RETRY_MIN``
to ``RETRY_MAX``, never past the holders' remaining leases or the caller's
deadline), which is what keeps competing waiters from colliding again.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from django_redislock import validation
from django_redislock.engine.steps import (
    HELD,
    REFUSED,
    Call,
    FanOut,
    Outcome,
    Pause,
    QuorumStep,
    acquire_reply,
)
from django_redislock.exceptions import LockBackendError

logger = logging.getLogger(__name__)

#: Clock drift allowance of the Redlock algorithm: 1% of the lease plus 2 ms.
DRIFT_FACTOR = 0.01
DRIFT_FIXED = 0.002
#: Bounds of the random delay between two attempts of a waiting acquire.
RETRY_MIN = 0.005
RETRY_MAX = 0.1
#: How long undoing a failed attempt may wait for any one server.
UNDO_TIMEOUT = 1.0
#: Below this lease the drift allowance takes all of it: no attempt is ever valid.
NO_VALIDITY = DRIFT_FIXED / (1 - DRIFT_FACTOR)
#: The shortest Redlock lease. Just above ``NO_VALIDITY`` what is left is
#: shorter than a majority's replies and the watchdog's renewals (a round
#: trip to every server, every third of the lease) need.
MIN_LEASE = 0.01


def drift(lease: float) -> float:
    """The clock-drift allowance for ``lease`` seconds."""
    return lease * DRIFT_FACTOR + DRIFT_FIXED


def check_lease(value: object, argument: str = "timeout") -> float | None:
    """``validation.check_lease``, and at least ``MIN_LEASE``: a shorter lease
    would be accepted and then fail every acquire or renewal, as a timeout or a
    lost lock rather than as the bad argument it is."""
    seconds = validation.check_lease(value, argument)
    if seconds is not None and seconds < MIN_LEASE:
        raise ValueError(too_short(argument, value))
    return seconds


def too_short(argument: str, value: object) -> str:
    return (
        f"{argument} of a Redlock must be at least {MIN_LEASE} s ({MIN_LEASE * 1000:.0f} ms), "
        f"got {value!r}: the clock-drift allowance (1% of the lease + 2 ms) leaves no "
        f"validity below {NO_VALIDITY * 1000:.2f} ms, and too little for the servers' "
        f"replies and the renewals below {MIN_LEASE * 1000:.0f} ms."
    )


def reply_timeout(lease: float, allowance: float) -> float:
    """How long to wait for any one server: small beside the lease.

    The Redlock algorithm asks for a per-server timeout much shorter than the
    lease, so that one stalled server (a minority) cannot eat the validity the
    majority granted; 5% of the lease, at least 250 ms for a loaded machine.
    """
    return max(min(lease - allowance, max(0.25, lease * 0.05)), 0.001)


def quorum(count: int) -> int:
    return count // 2 + 1


def too_few_error(name: str, results: list[Any], action: str) -> LockBackendError:
    """The error when fewer than a majority answered ``action``."""
    failures = [r for r in results if isinstance(r, BaseException)]
    answered = len(results) - len(failures)
    error = LockBackendError(
        f"Redlock {name!r}: only {answered} of {len(results)} Redis servers answered the "
        f"{action}; a majority ({quorum(len(results))}) is needed. First failure: "
        f"{type(failures[0]).__name__}: {failures[0]}"
        if failures
        else f"Redlock {name!r}: no majority could {action} it.",
        name=name,
    )
    if failures:
        error.__cause__ = failures[0]
    return error


@dataclass(frozen=True, slots=True)
class QuorumAttempt:
    """One ``Redlock`` acquire, as the quorum protocol needs it.

    ``call``: the lock script's acquire, the same on every server; ``undo``:
    the release of this attempt's token; ``count``: how many servers.
    """

    name: str
    call: Call
    undo: Call
    count: int
    lease: float
    deadline: float | None


def acquire(attempt: QuorumAttempt) -> Generator[QuorumStep, Any, Outcome]:
    """Attempts until a majority grants the lock in time, or the deadline passes.

    Held (status ``HELD``, value: the largest fencing counter granted) when a
    majority granted it and the lease less the time taken and the drift
    allowance is still positive. Otherwise the attempt is undone wherever it
    may have been granted, and retried after a random, growing pause; at the
    deadline the outcome is ``REFUSED`` with a retry hint in ms. Fewer than a
    majority answering is a ``LockBackendError`` at once (waiting would not
    help); any exception while the attempt is out undoes it everywhere.
    """
    lease, needed = attempt.lease, quorum(attempt.count)
    allowance = drift(lease)
    delay = RETRY_MIN
    while True:
        started = time.monotonic()
        try:
            results = yield FanOut(attempt.call, reply_timeout(lease, allowance))
        except GeneratorExit:
            raise
        except BaseException:  # interrupted mid-way: undo wherever it may have landed
            yield from _undo(attempt, [None] * attempt.count)
            raise
        replies = [acquire_reply(r) if isinstance(r, int | list) else None for r in results]
        granted = [r[1] for r in replies if r is not None and r[0] == HELD]
        if len(granted) >= needed and lease - (time.monotonic() - started) - allowance > 0:
            return Outcome(HELD, max(granted), started)
        yield from _undo(attempt, results)
        failures = sum(1 for r in results if isinstance(r, BaseException))
        if attempt.count - failures < needed:
            raise too_few_error(attempt.name, results, "acquire")
        hint = retry_after(replies, needed)
        now = time.monotonic()
        if attempt.deadline is not None and now >= attempt.deadline:
            return Outcome(REFUSED, int(hint * 1000), started, refusal=holding_reply(results))
        pause = random.uniform(0.5, 1.0) * delay
        if hint > 0:
            pause = min(pause, hint)
        if attempt.deadline is not None:
            pause = min(pause, attempt.deadline - now)
        yield Pause(max(pause, 0.0))
        delay = min(delay * 2, RETRY_MAX)


def holding_reply(results: list[Any]) -> list[Any] | None:
    """The refusal naming the holder that most servers named (``LockTimeout.holder``):
    the servers disagree only while holds change hands, and then the one most
    of them have is the likeliest to be the Redlock's holder."""
    refusals = [r for r in results if isinstance(r, list) and len(r) == 2]
    if not refusals:
        return None
    values = Counter(r[1] for r in refusals)
    top = values.most_common(1)[0][0]
    return next(r for r in refusals if r[1] == top)


def retry_after(replies: list[tuple[int, int] | None], needed: int) -> float:
    """Seconds until enough current holders' leases end for a majority to be
    free (``replies``: decoded acquire replies, ``None`` for a failed server)."""
    hints = sorted(r[1] for r in replies if r is not None and r[0] == REFUSED)
    free = len(replies) - len(hints)
    missing = needed - free
    if missing <= 0 or not hints:
        return 0.0
    return hints[min(missing, len(hints)) - 1] / 1000.0


def _undo(attempt: QuorumAttempt, results: list[Any]) -> Generator[QuorumStep, Any, None]:
    """Release a failed attempt wherever it may have been granted (``None``:
    unknown); best effort, as the leases run out by themselves."""
    touched = tuple(
        index
        for index, r in enumerate(results)
        if r is None or isinstance(r, BaseException) or (isinstance(r, int) and r > 0)
    )
    if touched:
        try:
            yield FanOut(attempt.undo, UNDO_TIMEOUT, touched)
        except Exception as exc:
            logger.debug("Could not undo a failed attempt on %r: %s", attempt.name, exc)
