"""Signals sent by every primitive.

Each is sent with ``sender`` = the primitive's class and keyword arguments
``name`` (the lock name as given), ``kind`` (``"lock"``, ``"semaphore"``, ...)
and timings in seconds:

- ``lock_acquired``: ``waited`` (time in line: ``0.0`` when a ``Lock`` or
  ``Semaphore`` never queued), ``fencing_token``
- ``lock_released``: ``held``
- ``lock_lost``: ``held``, ``reason`` — sent from one of the watchdog's
  threads when a renewal finds the lease gone or goes unanswered past the
  lease end, or when it stops renewing at the hold's ``max_hold`` (``reason``
  then starts with ``holds.losses.CAPPED_PREFIX``), or from the holder's
  thread when its release or extend finds it gone. Receivers must be quick
  and thread-safe.
- ``lock_contended``: ``waited``, ``outcome``, ``holder``, ``held_for`` — a
  waiter gave up: ``"timeout"`` when it was willing to wait and its time ran
  out, ``"refused"`` when it asked not to wait (``blocking=False``);
  ``holder`` (a ``HolderInfo`` or ``None``) and ``held_for`` (seconds or
  ``None``): who held the name then, and for how long, as on the
  ``LockTimeout`` (see ``exceptions.LockTimeout``).
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
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()
lock_failed = Signal()
renewal_lag = Signal()


def wanted(signal: Signal) -> bool:
    """Whether anyone listens: only then are a signal's keywords worth building."""
    return bool(signal.receivers)


def notify(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal``; a receiver's exception is logged, never raised.

    A lock's state must not depend on its receivers: a failing
    ``lock_acquired`` receiver would otherwise leave a lock held that its
    ``with`` block never entered, and a failing ``lock_lost`` receiver would
    kill the watchdog's thread that renews the leases held on that server.
    """
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a django-redislock signal failed: %r", receiver, exc_info=result
            )


def announce_acquired(primitive: Any, waited: float, fencing_token: int | None) -> None:
    """``lock_acquired`` for ``primitive`` (anything with a ``name`` and a
    ``kind``); sent on every acquire, so its keyword arguments are built only
    when someone listens. The app's own bookkeeping of an acquire is no
    receiver: the primitive tallies it itself (``holds/counters.py``)."""
    if lock_acquired.receivers:
        notify(
            lock_acquired,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            waited=waited,
            fencing_token=fencing_token,
        )


def announce_released(primitive: Any, acquired_at: float) -> None:
    """``lock_released``; ``acquired_at``: the hold's ``time.monotonic()`` when taken."""
    if lock_released.receivers:  # wanted(), inlined: every release
        notify(
            lock_released,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            held=time.monotonic() - acquired_at,
        )


def announce_contended(
    primitive: Any,
    begun: float,
    may_wait: bool = True,
    holder: Any = None,
    held_for: float | None = None,
) -> None:
    """``lock_contended``: a waiter that began at ``begun`` gave up; one that
    asked not to wait (``may_wait`` false) was refused, not timed out.
    ``holder``, ``held_for``: who held the name, as the refusal said."""
    if wanted(lock_contended):
        notify(
            lock_contended,
            sender=type(primitive),
            name=primitive.name,
            kind=primitive.kind,
            waited=time.monotonic() - begun,
            outcome="timeout" if may_wait else "refused",
            holder=holder,
            held_for=held_for,
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
