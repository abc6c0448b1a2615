"""The fair acquire, written once and without I/O.

An acquire is a generator (the h11/wsproto shape): it yields the next step,
a ``Call`` of a script or a ``Wait`` on the caller's signal list, is sent
the step's reply, and returns an ``Outcome``. ``engine/drivers.py`` runs it on a
synchronous client or on asyncio; ``Lock``, ``AsyncLock`` and the permit
primitives (sync and async) describe their attempt with an ``Attempt`` and
share this one loop. ``Redlock``'s quorum acquire (``primitives/redlock/quorum.py``) has steps
of its own, ``FanOut`` and ``Pause``, run by ``primitives/redlock/fanout.run_quorum``.

Waiting is event driven: a waiter queues itself in the acquire script, then
blocks on its own signal list with ``BLPOP``; a release pushes to the list
of the first waiter. Each wait is bounded by the holder's remaining lease
and by the connection's socket timeout (``chunk``), so a lost wake-up or a
dead holder costs at most the rest of the lease, and a blocking command never
outlives the socket timeout. Every step of an acquire with a
``blocking_timeout`` carries its deadline, and the drivers end it soon after
that deadline even when Redis stops answering (``engine/bounds.py``); the clean-up of
such an attempt is sent in the background once Redis answers again.

Timeline of an interrupted acquire, which is why clean-up is part of the
protocol::

    attempt sent -> Redis grants (or queues) -> reply lost / Ctrl-C / cancel
    clean-up: the attempt's undo (a Lock's cancel script passes the grant on,
    and leaves the queue), then the original exception
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_redislock.backend import client as backend
from django_redislock.backend.values import HolderInfo, lock_holder, member_holder

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script

logger = logging.getLogger(__name__)

#: An attempt's status: granted (the value is the fencing token).
HELD = 1
#: Refused (the value is a retry hint in ms).
REFUSED = 0
#: Handed over by a release while waiting (the value is the fencing token;
#: see ``backend/scripts/_handoff.lua``).
HANDED = 2
#: What a plain wake-up pushes to a waiter's signal list (a handoff pushes a fencing token).
WAKE_UP = (b"1", "1")
#: A reentrant acquire found the lock no longer ours (the acquire script's ``0``).
NOT_OURS = -1
#: A permit acquire's status: its stored limit differs from this holder's (refused).
LIMIT_MISMATCH = -2


def acquire_reply(reply: int | list[Any]) -> tuple[int, int]:
    """``(status, value)`` of the lock acquire script's one-integer reply.

    Held: the fencing token (> 0), or -1 when none is taken yet (the value is
    then 0: taken on first use); 0: a reentrant acquire found the lock no
    longer ours; below -1: refused, with a retry hint of ``-2 - reply`` ms;
    ``[that, value]``: refused by a holder whose value is ``value``
    (``refusal_holder``). Here, beside the steps that read it, because
    ``Lock`` and ``Redlock``'s quorum both decode it.
    """
    if isinstance(reply, list):
        return REFUSED, -2 - int(reply[0])
    if reply > 0:
        return HELD, reply
    if reply == -1:
        return HELD, 0
    if reply == 0:
        return NOT_OURS, 0
    return REFUSED, -2 - reply


def permit_reply(reply: int | list[Any]) -> tuple[int, int]:
    """``(status, value)`` of a permit acquire script's reply: ``{status, value}``
    (a refusal may add the first-ending holder's member, ``refusal_holder``),
    or the bare fencing token of a grant (``> 0``)."""
    if isinstance(reply, int):
        return HELD, reply
    return int(reply[0]), int(reply[1])


def refusal_holder(reply: Any) -> HolderInfo | None:
    """Who held the name, from a refused acquire's reply: a ``Lock`` script's
    ``[code, value]`` or a permit script's ``[0, hint_ms, member]``; ``None``
    when the reply names nobody (the name was free but promised to a waiter
    queued ahead, or the acquire never got a reply). Decoded only once an
    acquire has given up, never on the way to a grant."""
    if not isinstance(reply, list):
        return None
    try:
        if len(reply) == 3 and isinstance(reply[2], bytes | str):
            return member_holder(reply[2], int(reply[1]))
        if len(reply) == 2 and isinstance(reply[1], bytes | str) and int(reply[0]) <= -2:
            return lock_holder(reply[1], -2 - int(reply[0]))
    except (TypeError, ValueError):  # not a reply of ours: nobody named, the timeout stands
        logger.debug("An acquire's refusal named no holder: %r", reply)
    return None


# Call and Wait are never changed once built, but not frozen: a frozen
# dataclass's __init__ costs about 1 µs more, and every acquire builds one.


@dataclass(slots=True)
class Call:
    """Run ``script`` with ``keys`` and ``args``; ``shield``: a clean-up that
    must run even when the caller is being cancelled. ``deadline``: the
    acquire's (``time.monotonic()``), which bounds the call even when Redis
    stops answering (``engine/bounds.py``); ``background``: send it from the
    janitor thread once Redis answers again, without waiting. ``after``: for
    a clean-up, the command it undoes while that may still reach Redis (a
    worker's future, ``drivers.follow``): the janitor sends it after that."""

    script: Script
    keys: Sequence[str | bytes]
    args: Sequence[Any]
    shield: bool = False
    deadline: float | None = None
    background: bool = False
    after: Any = None


@dataclass(slots=True)
class Wait:
    """``BLPOP`` the caller's own signal list for at most ``timeout`` seconds;
    the reply is ``(key, value)`` or ``None``."""

    key: str | bytes
    timeout: float
    deadline: float | None = None


Step = Call | Wait


@dataclass(frozen=True, slots=True)
class FanOut:
    """Run ``call`` on every server at once (``only``: on those numbered), each
    reply awaited at most ``timeout`` seconds; the reply is one result per
    server, in order: its value, or its exception (``None`` outside ``only``)."""

    call: Call
    timeout: float | None
    only: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds`` before the next attempt."""

    seconds: float


QuorumStep = FanOut | Pause


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an acquire came to: ``status`` (``HELD``, ``HANDED``, ``REFUSED``,
    or a primitive's own), its value (fencing token or retry hint in ms),
    when the last attempt was sent (a lease is measured from there), and
    whether it waited in line first (only then does its time count as a wait).
    ``refusal``: a refused outcome's last reply, which may say who held the
    name (``refusal_holder``)."""

    status: int
    value: int
    started: float
    waited: bool = False
    refusal: Any = field(default=None, compare=False)

    @property
    def held(self) -> bool:
        return self.status in (HELD, HANDED)


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """What an acquire of any primitive came to, for its callers (``__enter__``,
    ``@require_lock``, ``MultiLock``): ``held``, or refused, with the seconds
    after which a retry may succeed (``None``: no hint). ``name``: the part
    that refused, for a composite (``MultiLock``); ``holder`` and
    ``held_for``: who held it when the acquire gave up, and for how long
    (``LockTimeout.holder``), ``None`` when unknown."""

    held: bool
    retry_after: float | None = None
    name: str | None = None
    holder: HolderInfo | None = None
    held_for: float | None = None

    @staticmethod
    def refused(retry_after_ms: int, refusal: Any = None) -> AcquireResult:
        """Refused, from a script's retry hint in ms (0 or below: no hint) and
        its reply (``Outcome.refusal``), which may name the holder."""
        retry_after = retry_after_ms / 1000.0 if retry_after_ms > 0 else None
        if refusal is None:
            return AcquireResult(False, retry_after)
        holder = refusal_holder(refusal)
        held_for = None if holder is None else holder.held_for()
        return AcquireResult(False, retry_after, None, holder, held_for)


#: The result of every acquire that holds.
HELD_RESULT = AcquireResult(True)


@dataclass(slots=True)
class Attempt:
    """One primitive's acquire, as the protocol needs it.

    ``call`` is the acquire script's call (``on_wait`` may return the next
    attempt's call instead, or update its arguments in place); ``parse`` turns
    its reply into ``(status, value)``;
    ``leave`` takes the caller out of the queue; ``undo`` is the clean-up after
    an interruption (``None``: ``leave`` when it may have queued).
    ``handoff_lease``: a handoff's first lease in seconds, 0 when a signal is
    only a wake-up.
    """

    name: str
    call: Call
    parse: Callable[[Any], tuple[int, int]]
    leave: Call
    signal_key: str | bytes
    chunk: float
    may_wait: bool
    deadline: float | None
    undo: Call | None = None
    handoff_lease: float = 0.0
    on_wait: Callable[[], Call | None] | None = field(default=None)


#: An attempt's round trip slower than this is planned for (``acquire``):
#: a wait leaves room for its answer and the re-check after it, the acquire
#: gives up when no such round fits in the budget, and a refused one leaves
#: the queue in the background (inline, that would end a round trip, or a
#: new connection's set-up, after the deadline). A healthy Redis answers in
#: a millisecond or two, and its jitter below this changes nothing.
SLOW_ROUND_TRIP = 0.1


def wait_seconds(
    hint_ms: int, chunk: float, deadline: float | None, round_trip: float = 0.0
) -> float:
    """How long one BLPOP may block: the lease hint, the chunk, the deadline,
    less two ``round_trip`` (its answer, then the re-check after it), so the
    re-check is answered by the deadline on a slow Redis too."""
    wait = chunk
    if hint_ms > 0:
        wait = min(wait, hint_ms / 1000.0)
    if deadline is not None:
        wait = min(wait, deadline - time.monotonic() - 2 * round_trip)
    return max(wait, backend.MIN_WAIT_CHUNK)


def handoff_fresh(started: float, handoff_lease: float) -> bool:
    """Whether a handoff just read can be taken as it is.

    The handoff came after the attempt sent at ``started``, so its first
    lease ends no earlier than ``started + handoff_lease``. With less than a
    quarter of it left (a waiter paused past it) another acquire attempt is
    the safe way: it finds the lock still the waiter's, and sets the full
    lease, or not, and queues it again.
    """
    return handoff_lease > 0 and time.monotonic() - started < 0.75 * handoff_lease


def bounded(call: Call, deadline: float | None) -> Call:
    """``call`` bounded by the acquire's ``deadline`` (``None``: unbounded)."""
    if deadline is None:
        return call
    return Call(call.script, call.keys, call.args, call.shield, deadline)


def acquire(attempt: Attempt) -> Generator[Step, Any, Outcome]:
    """The fair acquire: attempts until one answers other than ``REFUSED``.

    A refused attempt queues the caller when it may wait; between attempts
    the caller waits on its own signal list for a wake-up or a handoff
    (``_handed``). Giving up, or a status other than held or refused, leaves
    the queue; any exception runs the clean-up, then is raised
    (``interrupted``)."""
    queued = waited = False
    deadline = attempt.deadline
    call = bounded(attempt.call, deadline)
    round_trip = 0.0  # the last attempt's, a new connection's set-up included
    started = time.monotonic()
    try:
        while True:
            started = time.monotonic()
            reply = yield call
            status, value = attempt.parse(reply)
            round_trip = time.monotonic() - started
            if status != REFUSED:
                if status not in (HELD, HANDED) and queued:
                    yield _leave(attempt, deadline, round_trip)
                return Outcome(status, value, started, waited)
            queued = attempt.may_wait
            if not queued or _spent(deadline, round_trip):
                if queued:
                    yield _leave(attempt, deadline, round_trip)
                return Outcome(REFUSED, value, started, waited, reply)
            wait = wait_seconds(value, attempt.chunk, deadline, _slow(round_trip))
            signal = yield Wait(attempt.signal_key, wait, deadline)
            waited = True
            if _handed(signal, started, attempt.handoff_lease):
                return Outcome(HANDED, int(signal[1]), started, waited)
            if attempt.on_wait is not None:
                attempt.call = attempt.on_wait() or attempt.call
                call = bounded(attempt.call, deadline)
    except GeneratorExit:
        raise
    except backend.PoolExhausted as exc:
        if deadline is None:  # no budget to run out of: the pool is too small
            raise backend.exhausted_error(attempt.name, exc) from exc
        # The budget ran out waiting for a free connection of the pool: a
        # timeout, as for a busy lock, never an outage. Queued, it leaves the
        # line in the background (the janitor waits for a connection too).
        if queued:
            leave = attempt.leave
            yield Call(leave.script, leave.keys, leave.args, True, deadline, True)
        return Outcome(REFUSED, 0, started, waited)
    except BaseException as exc:
        cleanup = attempt.undo or (attempt.leave if attempt.may_wait else None)
        yield from interrupted(attempt.name, cleanup, deadline, exc)
        raise  # pragma: no cover - interrupted() raises


def _handed(signal: Any, started: float, handoff_lease: float) -> bool:
    """Whether ``signal`` is a handoff (not a plain wake-up) to take as it is
    (``handoff_fresh``); a stale one is checked by another attempt."""
    return signal is not None and signal[1] not in WAKE_UP and handoff_fresh(started, handoff_lease)


def interrupted(
    name: str, cleanup: Call | None, deadline: float | None, exc: BaseException
) -> Generator[Step, Any, None]:
    """Send ``cleanup`` (best effort: a Redis error there must not replace
    the original), then raise ``exc``; Redis failures as ``LockBackendError``.
    The clean-up of an interrupted attempt, ``acquire``'s or a primitive's
    own first command (a Lock's plain ``SET NX``).

    Redis did not answer within the budget, or the caller gave up on a
    command still on its way from a worker thread (drivers.in_thread): the
    clean-up is sent in the background (``engine/janitor.py``), after it. So it is
    when Redis failed (redis-py dropped the connection: a new one's set-up,
    several round trips, and a first NOSCRIPT would not be bounded by the
    deadline): the caller never waits on a clean-up that could outlive its
    deadline."""
    unanswered = isinstance(exc, backend.Unanswered)
    after = getattr(exc, "after", None)  # the command still on its way (drivers.follow)
    behind = unanswered or after is not None or isinstance(exc, backend.DROPPED)
    if cleanup is not None:
        try:
            yield Call(cleanup.script, cleanup.keys, cleanup.args, True, deadline, behind, after)
        except backend.BACKEND_ERRORS as cleanup_exc:
            logger.debug("Could not clean up an interrupted acquire of %r: %s", name, cleanup_exc)
    if unanswered:
        raise backend.unanswered_error(name, exc) from exc
    if isinstance(exc, backend.BACKEND_ERRORS):
        raise backend.backend_error(name, exc) from exc
    raise exc


def _slow(round_trip: float) -> float:
    """``round_trip`` where it is slow enough to plan for, else 0 (a healthy
    Redis's jitter must not cut waits short)."""
    return round_trip if round_trip > SLOW_ROUND_TRIP else 0.0


def _spent(deadline: float | None, round_trip: float) -> bool:
    """Whether the budget is spent: the deadline passed, or on a slow Redis
    it would pass before a wait's answer and the re-check after it came back."""
    return deadline is not None and time.monotonic() + 2 * _slow(round_trip) >= deadline


def _leave(attempt: Attempt, deadline: float | None, round_trip: float) -> Call:
    """Leaving the queue after the acquire came to an end: a clean-up
    (``shield``), so it never changes the outcome. At once, bounded by the
    deadline, while Redis answers promptly (the driver gives it to the janitor
    when no time is left, or Redis did not answer in what was); in the
    background (the janitor) once the budget is spent on a slow Redis, where
    the caller would wait a round trip or more past the deadline."""
    leave = attempt.leave
    if deadline is None:
        return leave
    background = bool(_slow(round_trip)) and _spent(deadline, round_trip)
    return Call(leave.script, leave.keys, leave.args, True, deadline, background)


def single(call: Call, name: str) -> Generator[Step, Any, Any]:
    """One script call, its reply returned; Redis failures as ``LockBackendError``
    (``LockBackendTimeout`` when a bounded call went unanswered past its deadline)."""
    try:
        return (yield call)
    except backend.Unanswered as exc:
        raise backend.unanswered_error(name, exc) from exc
    except backend.BACKEND_ERRORS as exc:
        raise backend.backend_error(name, exc) from exc
