"""Every error the app raises on purpose derives from :class:`LockError`.

Errors carry data (``name``, ``retry_after``, ``available``) so callers can
answer a user or schedule a retry without parsing messages.
"""

from __future__ import annotations


class LockError(Exception):
    """Base class of every lock failure, so one ``except`` covers them all."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockTimeout(LockError):
    """The primitive could not be acquired within the blocking timeout.

    ``retry_after`` is the server's best guess, in seconds, of when the
    current holder's lease ends (``None`` when unknown).
    """

    def __init__(
        self, message: str, *, name: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.retry_after = retry_after


class LockNotOwnedError(LockError):
    """Release or extend by someone who does not hold the lock."""


class LockLostError(LockError):
    """The lease was lost while the holder believed it held the lock.

    It expired, an operator cleared it, or Redis lost it (restart, failover).
    Work done under the lock since then was not mutually exclusive.
    ``rolled_back`` is ``True`` when it was raised by the commit of a database
    transaction the hold had been handed to (``@require_lock``), which it
    rolled back instead.
    """

    rolled_back: bool = False


class LockBackendError(LockError):
    """Redis could not be reached or answered with an error; the cause is chained."""


class LockBackendTimeout(LockBackendError, LockTimeout):
    """Redis stopped answering and the blocking timeout ran out while it did.

    Both a ``LockBackendError`` (Redis failed: ``require_lock`` answers 503)
    and a ``LockTimeout`` (the primitive could not be acquired in time), so
    either ``except`` sees it; ``retry_after`` is ``None``. The redis-py
    timeout that cut the unanswered command is chained (``__cause__``).
    """


class InsufficientStock(Exception):
    """Not enough stock for a deduction; nothing was changed.

    Not a ``LockError``: the lock worked, the shelf is empty. ``available`` is
    what was in stock when the deduction was refused, ``requested`` what was
    asked for, ``item`` the primary key of the row.
    """

    def __init__(self, message: str, *, item: object, available: int, requested: int) -> None:
        super().__init__(message)
        self.item = item
        self.available = available
        self.requested = requested
