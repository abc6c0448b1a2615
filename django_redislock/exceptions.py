"""Every error the app raises on purpose derives from :class:`LockError`.

Errors carry data (``name``, ``retry_after``, ``available``) so callers can
answer a user or schedule a retry without parsing messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_redislock.backend.values import HolderInfo


class LockError(Exception):
    """Base class of every lock failure, so one ``except`` covers them all."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockTimeout(LockError):
    """The primitive could not be acquired within the blocking timeout.

    ``retry_after`` is the server's best guess, in seconds, of when the
    current holder's lease ends (``None`` when unknown). ``holder`` is who
    held the name when the wait ended (a ``HolderInfo``: ``host``, ``pid``,
    ``thread``, ``runs``, ``since``; its token shortened to 8 characters),
    and ``held_for`` the seconds it had held it by then (the holder's clock
    at acquire against this process's, so off by their skew): read from the
    reply of the acquire's last refused attempt, at no extra round trip;
    ``None`` when that reply named nobody. See ``docs/long-holds.md``.
    """

    holder: HolderInfo | None = None
    held_for: float | None = None

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        retry_after: float | None = None,
        holder: HolderInfo | None = None,
        held_for: float | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.retry_after = retry_after
        self.holder = holder
        self.held_for = held_for


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


class LockPoolExhausted(LockBackendError):
    """No connection of the cache's pool came free for a command that had no
    budget to wait in (a release, an extend): every one of the pool's
    ``max_connections`` was in use in this process. Redis itself may be
    idle: the fix is a larger pool (``docs/operations.md``, "Pool sizing"),
    not a look at the server. An acquire that waits for a connection past
    its blocking timeout raises ``LockTimeout`` instead, as for a busy lock.
    """

    def __init__(
        self, message: str, *, name: str | None = None, max_connections: int | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.max_connections = max_connections


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
