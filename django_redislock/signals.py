"""Signals sent by every primitive.

Each is sent with ``sender`` = the primitive's class and keyword arguments
``name`` (the lock name as given), ``kind`` (``"lock"``, ``"semaphore"``, ...)
and timings in seconds:

- ``lock_acquired``: ``waited``, ``fencing_token``
- ``lock_released``: ``held``
- ``lock_lost``: ``held``, ``reason`` — sent from the watchdog thread when a
  renewal finds the lease gone, or from the holder's thread when its release
  does. Receivers must be quick and thread-safe.
- ``lock_contended``: ``waited`` — a waiter gave up.

Receivers' exceptions are logged (logger ``django_redislock.signals``) and
never propagate into the lock: see ``notify``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()


def notify(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal``; a receiver's exception is logged, never raised.

    A lock's state must not depend on its receivers: a failing
    ``lock_acquired`` receiver would otherwise leave a lock held that its
    ``with`` block never entered, and a failing ``lock_lost`` receiver would
    kill the watchdog thread that renews every lease of the process.
    """
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a django-redislock signal failed: %r", receiver, exc_info=result
            )
