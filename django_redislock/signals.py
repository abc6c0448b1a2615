"""Signals sent by every primitive.

Each is sent with ``sender`` = the primitive's class and keyword arguments
``name`` (the lock name as given), ``kind`` (``"lock"``, ``"semaphore"``, ...)
and timings in seconds:

- ``lock_acquired``: ``waited`` (time in line: ``0.0`` when a ``Lock`` or
  ``Semaphore`` never queued), ``fencing_token``
- ``lock_released``: ``held``
- ``lock_lost``: ``held``, ``reason`` — sent from one of the watchdog's
  threads when a renewal finds the lease gone or goes unanswered past the
  lease end, or from the holder's thread when its release or extend finds it
  gone. Receivers must be quick and thread-safe.
- ``lock_contended``: ``waited``, ``outcome`` — a waiter gave up:
  ``"timeout"`` when it was willing to wait and its time ran out,
  ``"refused"`` when it asked not to wait (``blocking=False``).
- ``lock_failed``: ``waited``, ``error`` (the ``LockBackendError``) — an
  acquire that Redis did not answer; sent before the error is raised.

And one about the process, sent with ``sender`` = the watchdog's class:

- ``renewal_lag``: ``lagging`` (bool), ``lag`` (seconds the oldest renewal
  was late), ``share`` (of its lease), ``at_risk`` (holds whose renewal is
  overdue), ``holds`` (holds renewed) — sent from a watchdog thread when its
  renewals fall behind by more than a fifth of a lease (leases are lost at two
  thirds), and again when they caught up. See ``holds/lag.py``.

Receivers' exceptions are logged (logger ``django_redislock.signals``) and
never propagate into the lock: see ``notify``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()
lock_failed = Signal()
renewal_lag = Signal()


#: The app's own receivers (``hot.install``), called directly: Django's
#: dispatch (``send_robust``) costs more than the rest of an uncontended
#: acquire's bookkeeping, and this app's receivers need none of it.
_TAPS: dict[Signal, tuple[Callable[..., Any], ...]] = {}


#: Taps of ``lock_acquired`` that get the acquires counted by the counters
#: (``announce_acquired(..., counted=True)``) from them instead.
_COUNTED: set[Callable[..., Any]] = set()


def tap(signal: Signal, receiver: Callable[..., Any], *, counted: bool = False) -> None:
    """Call ``receiver`` (like a receiver: ``signal``, ``sender``, keywords)
    whenever ``signal`` is notified; for this app's own receivers.
    ``counted``: not for an acquire the counters counted
    (``holds/counters.acquired_at_once``), which ``receiver``'s owner gets
    from them (the per-minute history)."""
    _TAPS[signal] = (*_TAPS.get(signal, ()), receiver)
    if counted:
        _COUNTED.add(receiver)


def untap(signal: Signal, receiver: Callable[..., Any]) -> None:
    _TAPS[signal] = tuple(r for r in _TAPS.get(signal, ()) if r != receiver)
    _COUNTED.discard(receiver)
    if not _TAPS[signal]:
        del _TAPS[signal]


def tapped(signal: Signal) -> tuple[Callable[..., Any], ...]:
    """The receivers ``tap`` gave ``signal``."""
    return _TAPS.get(signal, ())


def wanted(signal: Signal) -> bool:
    """Whether anyone listens: only then are a signal's keywords worth building."""
    return bool(signal.receivers) or signal in _TAPS


def notify(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal``; a receiver's exception is logged, never raised.

    A lock's state must not depend on its receivers: a failing
    ``lock_acquired`` receiver would otherwise leave a lock held that its
    ``with`` block never entered, and a failing ``lock_lost`` receiver would
    kill the watchdog's thread that renews the leases held on that server.
    """
    for tapped in _TAPS.get(signal, ()):
        try:
            tapped(signal=signal, sender=sender, **kwargs)
        except Exception:
            logger.exception("A receiver of a django-redislock signal failed: %r", tapped)
    if signal.receivers:
        _send(signal, sender, **kwargs)


def _send(signal: Signal, sender: type, **kwargs: Any) -> None:
    """``notify``'s part for the connected receivers: Django's dispatch, each
    receiver's exception logged."""
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a django-redislock signal failed: %r", receiver, exc_info=result
            )


def announce_acquired(
    primitive: Any, waited: float, fencing_token: int | None, *, counted: bool = False
) -> None:
    """``lock_acquired`` for ``primitive`` (anything with a ``name`` and a
    ``kind``); its keyword arguments are built only when someone listens.

    Sent on every acquire, so the app's own receivers (``tap``) are called
    here directly, each with its keywords once, rather than through ``notify``;
    ``counted``: the acquire was counted by the counters
    (``holds/counters.acquired_at_once``), which feed the taps made with
    ``counted=True`` (the per-minute history): those are skipped."""
    taps = _TAPS.get(lock_acquired)
    if taps is not None:
        sender, name, kind = type(primitive), primitive.name, primitive.kind
        for tapped in taps:
            if counted and tapped in _COUNTED:
                continue
            try:
                tapped(
                    signal=lock_acquired,
                    sender=sender,
                    name=name,
                    kind=kind,
                    waited=waited,
                    fencing_token=fencing_token,
                )
            except Exception:
                logger.exception("A receiver of a django-redislock signal failed: %r", tapped)
    if lock_acquired.receivers:
        _send(
            lock_acquired,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            waited=waited,
            fencing_token=fencing_token,
        )


def announce_released(primitive: Any, acquired_at: float) -> None:
    """``lock_released``; ``acquired_at``: the hold's ``time.monotonic()`` when taken."""
    if lock_released.receivers or lock_released in _TAPS:  # wanted(), inlined: every release
        notify(
            lock_released,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            held=time.monotonic() - acquired_at,
        )


def announce_contended(primitive: Any, begun: float, may_wait: bool = True) -> None:
    """``lock_contended``: a waiter that began at ``begun`` gave up; one that
    asked not to wait (``may_wait`` false) was refused, not timed out."""
    if wanted(lock_contended):
        notify(
            lock_contended,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            waited=time.monotonic() - begun,
            outcome="timeout" if may_wait else "refused",
        )


def announce_failed(primitive: Any, begun: float, error: BaseException) -> None:
    """``lock_failed``: an acquire begun at ``begun`` ended in ``error``
    (a ``LockBackendError``): neither held nor contended, so the other
    signals say nothing of it."""
    if wanted(lock_failed):
        notify(
            lock_failed,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            waited=time.monotonic() - begun,
            error=error,
        )
