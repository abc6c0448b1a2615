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
"""

from __future__ import annotations

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()
