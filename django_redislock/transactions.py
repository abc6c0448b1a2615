"""Locks held until the database transaction that needs them has ended.

``@require_lock`` and ``InventoryMixin`` hand their hold to the open
transaction: the writes made under the lock commit only when the outermost
``atomic()`` block ends, and releasing before that would let the next holder
read rows that are not committed yet. The hold still belongs to the thread
that made it (``holds/registry.py``), so the same thread taking the name again
nests instead of waiting on it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_redislock.exceptions import LockBackendError, LockError, LockLostError
from django_redislock.primitives.lock import Lock
from django_redislock.primitives.multilock import MultiLock

logger = logging.getLogger(__name__)

_HOLDS_ATTRIBUTE = "_django_redislock_transaction_locks"


class _Handed:
    """One level of a hold handed to the open transactions of one or more
    databases: released when the last of them has ended. A view under
    ``ATOMIC_REQUESTS`` on two databases runs inside both transactions, and
    its writes to either are uncommitted until that one ends."""

    __slots__ = ("committed", "lock", "on_end", "owners", "strict")

    def __init__(
        self,
        lock: Lock,
        owners: list[TransactionLocks],
        *,
        strict: bool = False,
        on_end: Callable[[bool], None] | None = None,
    ) -> None:
        self.lock = lock
        #: The transactions it was handed to that have not ended yet.
        self.owners = owners
        #: Whether the transaction must not commit once the lease is known
        #: lost (``@require_lock``'s writes have no guard of their own).
        self.strict = strict
        #: Called with whether every transaction it was handed to committed,
        #: after the last has ended and before the release (``@idempotent``
        #: stores its response there, still under its lock).
        self.on_end = on_end
        self.committed = True

    def lost(self) -> bool:
        """Whether the transaction must not commit: the hold was reported
        lost, or its lease ended by the holder's own clock (never later than
        Redis's) with nothing renewing it (``auto_renew=False``), which no
        one would report; reported here, once."""
        holding = self.lock._holding()
        if not self.strict or holding is None:
            return False
        if holding.lost is None and time.monotonic() >= holding.lease_deadline:
            holding.mark_lost("its lease had ended before its transaction committed")
        return holding.lost is not None

    def end(self, owner: TransactionLocks, *, now: bool = False) -> bool:
        """``owner``'s transaction ended (``now``: release it whatever the
        others', as ``release_transaction_holds`` does); whether that released
        it (``LockError`` when the release found the lease lost)."""
        self.owners.remove(owner)
        if self.owners and not now:
            return False
        for other in self.owners:
            other.locks.remove(self)
        self.owners = []
        try:
            if self.on_end is not None:
                self.on_end(self.committed)
        finally:
            self.lock.release()
        return True


class TransactionLocks:
    """Locks one database connection holds until its current transaction ends.

    Django has ``on_commit`` but no rollback hook, and an ``on_commit``
    callback registered inside a savepoint is dropped when that savepoint
    rolls back, although the lock must still be held until the outer
    transaction ends. So this wraps the connection's own ``commit``,
    ``rollback`` and ``close`` (the calls ``atomic`` makes when the outermost
    block ends, whichever way) and releases after them, once no atomic block
    is left. Installed once per connection object; with nothing held the
    wrappers only pass through.
    """

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        #: One entry per hold handed over, ended in reverse order.
        self.locks: list[_Handed] = []
        rollback = connection.rollback
        connection.commit = self._after(  # type: ignore[method-assign]
            self._unless_lost(connection.commit, rollback), final=False, commits=True
        )
        connection.rollback = self._after(rollback, final=False)  # type: ignore[method-assign]
        connection.close = self._after(connection.close, final=True)  # type: ignore[method-assign]

    @classmethod
    def of(cls, connection: BaseDatabaseWrapper) -> TransactionLocks:
        holds: TransactionLocks | None = connection.__dict__.get(_HOLDS_ATTRIBUTE)
        if holds is None:
            holds = cls(connection)
            setattr(connection, _HOLDS_ATTRIBUTE, holds)
        return holds

    def _unless_lost(
        self, commit: Callable[..., Any], rollback: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The commit, unless a ``@require_lock`` hold handed to this
        transaction is known lost: then its writes were made while another
        holder could make its own, so roll back and raise ``LockLostError``
        (``atomic`` rolls back only on a ``DatabaseError`` from the commit)."""

        @functools.wraps(commit)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lost = [entry for entry in self.locks if entry.lost()]
            if not lost or self.connection.in_atomic_block:
                return commit(*args, **kwargs)
            rollback()
            lock = lost[0].lock
            holding = lock._holding()
            assert holding is not None  # lost() found it
            error = lock._lost(holding)
            error.rolled_back = True
            raise error

        return wrapper

    def _after(
        self, method: Callable[..., Any], *, final: bool, commits: bool = False
    ) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            committed = False
            try:
                result = method(*args, **kwargs)
                committed = commits
                return result
            finally:
                if self.locks and (final or not self.connection.in_atomic_block):
                    self.release_all(committed=committed)

        return wrapper

    def holds(self, lock: Lock, *, strict: bool = False) -> bool:
        """Whether this transaction holds ``lock``'s name already: the same
        name on the same cache alias (and key prefix), not the name alone.

        ``strict``: from now on its commit also depends on that hold not being
        known lost, as if ``@require_lock`` had handed it over: a ``deduct()``
        may have handed the name over first, unguarded, while the decorated
        function's own writes under it have no guard of their own."""
        key = lock._own_hold_key()
        found = [held for held in self.locks if held.lock._own_hold_key() == key]
        for held in found if strict else ():
            held.strict = True
        return bool(found)

    def release_all(self, *, now: bool = False, committed: bool = True) -> int:
        """The transaction is over (``committed``: by a commit): release what
        it alone still held (``now``: everything it holds), never raising into
        the commit or rollback that just happened (a lost lease has already
        been reported through ``lock_lost``; the guarded UPDATE kept the stock
        right). Returns how many holds it released."""
        handed, self.locks = self.locks, []
        released = 0
        for entry in reversed(handed):
            try:
                entry.committed = entry.committed and committed
                released += entry.end(self, now=now)
            except LockError as exc:
                released += 1
                logger.warning("Releasing %r after the transaction ended: %s", entry.lock.name, exc)
            except Exception:  # the holds after it must still be released
                logger.exception("Releasing %r after the transaction ended", entry.lock.name)
        return released

    def hold(self, locks: Iterable[Lock]) -> None:
        self.locks.extend(_Handed(lock, [self]) for lock in locks)


def _in_transaction(connection: BaseDatabaseWrapper) -> bool:
    """In an atomic block, or connected with autocommit off (``set_autocommit(False)``,
    committed by hand): either way the writes are not committed yet.

    Reads the state Django keeps (``autocommit``) rather than ``get_autocommit()``,
    which ensures a connection first: a call that never touched the database
    must not need one (pytest-django refuses it outside ``django_db``)."""
    if connection.in_atomic_block:
        return True
    return connection.connection is not None and not connection.autocommit


def hand_over(
    lock: Lock, *, confirm: bool = True, on_end: Callable[[bool], None] | None = None
) -> bool:
    """Hand one level of the current thread's hold through ``lock`` to the open
    transactions (of every connection in an atomic block or with autocommit
    off), the last of which to end releases it after its commit or rollback.
    ``False``, to release now, when no transaction is open or each open one
    already holds the name until its end (a hold made unguarded, by
    ``deduct()``, is guarded from then on as this call's). A transaction that
    holds it does not stop the others from getting this level: the lock is
    free only when the last of them has ended.

    The hold is confirmed first (one round trip, which also renews it), as a
    release would have been: leaving with a lease already lost raises
    ``LockLostError`` into the transaction, which rolls back its writes. And
    a transaction whose hold is found lost later does not commit (see
    ``TransactionLocks._unless_lost``). Not ``confirm``: no round trip (the
    function raised; its exception, not a loss, is what goes on). ``on_end``
    is called, with whether every one of them committed, once the last has
    ended and before the release (not when this answers ``False``)."""
    if lock._holding() is None:  # the current thread holds nothing through it
        return False
    # each open transaction that does not hold the name yet; one that does
    # keeps it, now guarded as this call's (``TransactionLocks.holds``)
    open_: list[TransactionLocks] = []
    for connection in connections.all(initialized_only=True):
        if _in_transaction(connection):
            holds = TransactionLocks.of(connection)
            if not holds.holds(lock, strict=True):
                open_.append(holds)
    if not open_:
        return False
    try:
        if confirm:
            lock.extend()
    except LockLostError:
        return False  # released now: that release reports the loss (LockLostError)
    except LockBackendError as exc:  # unconfirmed: the watchdog will tell
        logger.warning("Could not confirm %r before the commit: %s", lock.name, exc)
    handed = _Handed(lock, open_, strict=True, on_end=on_end)
    for holds in open_:
        holds.locks.append(handed)
    return True


def hold_until_transaction_end(names: list[str], using: str, options: Mapping[str, Any]) -> None:
    """Take the locks ``names`` for the current transaction of ``using``.

    Must be called inside ``atomic(using=using)``. Names this transaction
    already holds are not taken again (no extra round trip); a name the thread
    holds otherwise is re-entered, never waited on.
    """
    holds = TransactionLocks.of(transaction.get_connection(using))
    candidates = {name: Lock(name, **options) for name in set(names)}
    wanted = sorted(name for name, lock in candidates.items() if not holds.holds(lock))
    if not wanted:
        return
    if len(wanted) == 1:
        lock = candidates[wanted[0]]
        lock.__enter__()  # LockTimeout when it cannot be had in time
        holds.hold([lock])
        return
    multi = MultiLock(wanted, **options)
    multi.__enter__()
    holds.hold(multi.locks)


def release_transaction_holds(using: str | None = None) -> int:
    """Release now what the open transactions hand-over holds, as their end would.

    For tests: inside ``TestCase`` (or pytest-django's ``django_db``) the
    test's transaction never commits, so holds handed to it last until the
    test ends. Call this where the test wants the state after the commit, as
    ``captureOnCommitCallbacks(execute=True)`` does for ``on_commit``.
    ``using``: one database alias (default: every connection); a hold
    handed to that transaction and to others' too (``ATOMIC_REQUESTS`` on
    several databases) is released now all the same. Returns how many holds
    were released.
    """
    aliases = (
        [using] if using is not None else [c.alias for c in connections.all(initialized_only=True)]
    )
    released = 0
    for alias in aliases:
        holds: TransactionLocks | None = connections[alias].__dict__.get(_HOLDS_ATTRIBUTE)
        if holds is not None:
            released += holds.release_all(now=True)
    return released
