"""The fair acquire, written once and without I/O.

An acquire is a generator (the h11/wsproto shape): it yields the next step,
a ``Call`` of a script or a ``Wait`` on the caller's signal list, is sent
the step's reply, and returns an ``Outcome``. ``drivers.py`` runs it on a
synchronous client or on asyncio; ``Lock``, ``AsyncLock`` and the permit
primitives (sync and async) describe their attempt with an ``Attempt`` and
share this one loop.

Waiting is event driven: a waiter queues itself in the acquire script, then
blocks on its own signal list with ``BLPOP``; a release pushes to the list
of the first waiter. Each wait is bounded by the holder's remaining lease
and by the connection's socket timeout (``chunk``), so a lost wake-up or a
dead holder costs at most the rest of the lease, and a blocking command never
outlives the socket timeout.

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

from . import backend

if TYPE_CHECKING:
    from .scripts import Script

logger = logging.getLogger(__name__)

#: An attempt's status: granted (the value is the fencing token).
HELD = 1
#: Refused (the value is a retry hint in ms).
REFUSED = 0
#: Handed over by a release while waiting (the value is the fencing token;
#: see ``scripts/_handoff.lua``).
HANDED = 2
#: What a plain wake-up pushes to a waiter's signal list (a handoff pushes a fencing token).
WAKE_UP = (b"1", "1")


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``script`` with ``keys`` and ``args``; ``shield``: a clean-up that
    must run even when the caller is being cancelled."""

    script: Script
    keys: Sequence[str | bytes]
    args: Sequence[Any]
    shield: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """``BLPOP`` the caller's own signal list for at most ``timeout`` seconds;
    the reply is ``(key, value)`` or ``None``."""

    key: str | bytes
    timeout: float


Step = Call | Wait


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an acquire came to: ``status`` (``HELD``, ``HANDED``, ``REFUSED``,
    or a primitive's own), its value (fencing token or retry hint in ms), and
    when the last attempt was sent (a lease is measured from there)."""

    status: int
    value: int
    started: float

    @property
    def held(self) -> bool:
        return self.status in (HELD, HANDED)


@dataclass(slots=True)
class Attempt:
    """One primitive's acquire, as the protocol needs it.

    ``call`` is the acquire script's call (its arguments may be updated in
    place by ``on_wait``), ``parse`` turns its reply into ``(status, value)``;
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
    on_wait: Callable[[], None] | None = field(default=None)


def wait_seconds(hint_ms: int, chunk: float, deadline: float | None) -> float:
    """How long one BLPOP may block: the lease hint, the chunk, the deadline."""
    wait = chunk
    if hint_ms > 0:
        wait = min(wait, hint_ms / 1000.0)
    if deadline is not None:
        wait = min(wait, deadline - time.monotonic())
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


def acquire(attempt: Attempt) -> Generator[Step, Any, Outcome]:
    """The fair acquire: attempts until one answers other than ``REFUSED``.

    A refused attempt queues the caller when it may wait; between attempts
    the caller waits on its own signal list. A signal other than a plain
    wake-up is a handoff (status ``HANDED``), taken as it is while fresh (see
    ``handoff_fresh``), else checked by another attempt. On giving up, or on
    a status other than held or refused, it leaves the queue. On any
    exception it runs the clean-up (best effort: a Redis error there must not
    replace the original) and raises; Redis failures as ``LockBackendError``.
    """
    queued = False
    try:
        while True:
            started = time.monotonic()
            status, value = attempt.parse((yield attempt.call))
            if status != REFUSED:
                if status not in (HELD, HANDED) and queued:
                    yield attempt.leave
                return Outcome(status, value, started)
            queued = attempt.may_wait
            deadline = attempt.deadline
            if not queued or (deadline is not None and time.monotonic() >= deadline):
                if queued:
                    yield attempt.leave
                return Outcome(REFUSED, value, started)
            signal = yield Wait(attempt.signal_key, wait_seconds(value, attempt.chunk, deadline))
            if (
                signal is not None
                and signal[1] not in WAKE_UP
                and handoff_fresh(started, attempt.handoff_lease)
            ):
                return Outcome(HANDED, int(signal[1]), started)
            if attempt.on_wait is not None:
                attempt.on_wait()
    except GeneratorExit:
        raise
    except BaseException as exc:
        cleanup = attempt.undo or (attempt.leave if attempt.may_wait else None)
        if cleanup is not None:
            try:
                yield Call(cleanup.script, cleanup.keys, cleanup.args, shield=True)
            except backend.BACKEND_ERRORS as cleanup_exc:
                logger.debug(
                    "Could not clean up an interrupted acquire of %r: %s", attempt.name, cleanup_exc
                )
        if isinstance(exc, backend.BACKEND_ERRORS):
            raise backend.backend_error(attempt.name, exc) from exc
        raise


def single(call: Call, name: str) -> Generator[Step, Any, Any]:
    """One script call, its reply returned; Redis failures as ``LockBackendError``."""
    try:
        return (yield call)
    except backend.BACKEND_ERRORS as exc:
        raise backend.backend_error(name, exc) from exc
