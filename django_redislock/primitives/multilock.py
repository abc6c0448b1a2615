"""``MultiLock``: several ``Lock``s taken all or nothing, in one canonical order.

Two carts that share SKUs must never wait on each other in a cycle. Taking the
names sorted, whatever order the caller listed them in, makes every holder
climb the same ladder, so a holder of ``b`` never waits for ``a`` while someone
holding ``a`` waits for ``b``::

    cart 1: [b, a] -> takes a, then b          cart 2: [a, b] -> takes a, then b
    cart 1 holds a                             cart 2 waits for a (holds nothing)
    cart 1 takes b, works, releases both       cart 2 takes a, then b

The parts are ordinary ``Lock``s: each is fair, fenced and watched; the whole
shares one blocking budget; a part that cannot be had in time, or any error
while taking the parts, releases those already taken before the caller hears
about it.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

from django_redislock.conf import get_settings
from django_redislock.engine.steps import HELD_RESULT, AcquireResult
from django_redislock.exceptions import LockError, LockLostError, LockNotOwnedError, LockTimeout
from django_redislock.holds import losses
from django_redislock.primitives import guarded
from django_redislock.primitives.guarded import Worded, timeout_error
from django_redislock.primitives.lock import Lock
from django_redislock.validation import (
    check_alias,
    check_lease,
    check_name,
    checked_options,
    fixed,
    wait_budget,
)

_M = TypeVar("_M", bound="MultiLock")


class _Once:
    """A ``MultiLock``'s ``on_lost``, given to each part: called once per hold
    of the set (however many parts are lost), with the ``MultiLock``."""

    __slots__ = ("callback", "fired", "multi")

    def __init__(self, multi: MultiLock, callback: Callable[[Any], object]) -> None:
        self.multi = weakref.ref(multi)
        self.callback = callback
        self.fired = False

    def __call__(self, part: Lock) -> None:
        multi = self.multi()
        if multi is None or self.fired:  # (one callback thread: no race here)
            return
        self.fired = True
        self.callback(multi)


class MultiLock(Worded):
    """All of ``names`` or none of them, for one holder: the thread (its parts are
    ``Lock``s, so the holding thread re-enters any of them through any handle).

    Names are de-duplicated and taken in sorted order. ``blocking_timeout``
    bounds the wait for the whole set, not for each part. Options mean what
    they mean for ``Lock`` and apply to every part.
    """

    # fixed when built: the parts are built from them (a later change would not reach them)
    names: tuple[str, ...] = fixed("names")
    using: str | None = fixed("using")

    def __init__(
        self,
        names: Iterable[str],
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
        on_lost: Callable[[Any], object] | None = None,
        max_hold: float | None = None,
    ) -> None:
        if isinstance(names, str | bytes):
            raise TypeError(
                f"names must be an iterable of names, not a single {type(names).__name__} "
                f"({names!r}); use Lock for one name or wrap it in a list."
            )
        try:
            given = list(names)
        except TypeError:
            raise TypeError(
                f"names must be an iterable of str, not {type(names).__name__}."
            ) from None
        for index, name in enumerate(given):
            check_name(name, f"names[{index}]")
        if not given:
            raise ValueError("names must contain at least one name.")
        self._names: tuple[str, ...] = tuple(sorted(set(given)))
        self._timeout, self._blocking, self._blocking_timeout, self._auto_renew = checked_options(
            timeout, blocking, blocking_timeout, auto_renew
        )
        self._using = check_alias(using)
        told = None
        if on_lost is not None or max_hold is not None:
            losses.loss_options(on_lost, max_hold, False, asyncio_holds=False)
            told = None if on_lost is None else _Once(self, on_lost)
        self._told = told
        self.locks: tuple[Lock, ...] = tuple(
            Lock(
                name,
                timeout=timeout,
                auto_renew=auto_renew,
                using=using,
                on_lost=told,
                max_hold=max_hold,
            )
            for name in self.names
        )

    @property
    def lost(self) -> bool:
        """Whether a part of this holder's set is known lost (no round trip; see ``Lock.lost``)."""
        return any(lock.lost for lock in self.locks)

    def check(self) -> None:
        """Raise ``LockLostError`` (the first lost part's) if ``lost``; no round trip."""
        for lock in self.locks:
            lock.check()

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r}>"

    def __enter__(self: _M) -> _M:
        return guarded.enter(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        guarded.leave(self, exc_type, exc)

    def _budget(self, blocking: bool | None, blocking_timeout: float | None) -> float | None:
        """Seconds the whole set may wait (``None``: for ever); 0 means try once.

        Checked as ``Lock.acquire`` checks them (``wait_budget``): a bad
        ``blocking_timeout`` is refused with ``blocking=False`` too, before
        any part is taken."""
        return wait_budget(self, blocking, blocking_timeout, get_settings())[1]

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take every part; ``False`` (holding none) when that cannot be done in time.

        Any exception while taking the parts (``LockBackendError``, an
        interrupt) releases the parts already taken before it propagates.
        """
        return self._acquire(blocking, blocking_timeout).held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> AcquireResult:
        """Held when every part is; else refused, naming the part that refused.

        A part taken early may have lapsed by the time the last one is had
        (no renewal and a lease shorter than the wait, or a renewal that
        failed): answering held then would let another holder in beside
        this set. Such a part is renewed if Redis still has it ours; if not,
        the whole set is taken again while the budget lasts."""
        budget = self._budget(blocking, blocking_timeout)
        deadline = None if budget is None else time.monotonic() + budget
        while True:
            result = self._take_every_part(deadline)
            if not result.held:
                return result
            lapsed = self._renew_lapsed()
            if lapsed is None:
                if self._told is not None:
                    self._told.fired = False  # a new hold: told of its loss once again
                return HELD_RESULT
            if deadline is not None and time.monotonic() >= deadline:
                return AcquireResult(False, name=lapsed)

    def _take_every_part(self, deadline: float | None) -> AcquireResult:
        """One pass over the parts, in order; all or none taken."""
        taken: list[Lock] = []
        try:
            for lock in self.locks:
                if deadline is None:
                    result = lock._acquire(True, None)
                else:
                    left = max(0.0, deadline - time.monotonic())
                    result = lock._acquire(left > 0, left)
                if not result.held:
                    self._release_quietly(taken)
                    return replace(result, name=lock.name)
                taken.append(lock)
        except BaseException:
            self._release_quietly(taken)
            raise
        return HELD_RESULT

    def _renew_lapsed(self) -> str | None:
        """Renew each part whose lease ended by this holder's reckoning
        (which ends it no later than Redis does) or was reported lost;
        ``None`` when every part is held, else the name of one found gone,
        after releasing them all."""
        now = time.monotonic()
        try:
            for lock in self.locks:
                holding = lock._handles.taken(lock)
                if holding is not None and holding.lost is None and holding.lease_deadline > now:
                    continue
                try:
                    lock.extend()
                except LockLostError:
                    self._release_quietly(list(self.locks))
                    return lock.name
        except BaseException:
            self._release_quietly(list(self.locks))
            raise
        return None

    @staticmethod
    def _release_quietly(taken: list[Lock]) -> None:
        """Undo a partial acquire; a part lost meanwhile (or Redis failing to
        hear the release: the lease then frees it) is no news to a caller who
        is being told that the whole acquire failed."""
        for lock in reversed(taken):
            with contextlib.suppress(LockError):
                lock.release()

    def _held_parts(self) -> tuple[Lock, ...]:
        """The parts this handle took in this thread, which a release or
        extend applies to; never a part the thread holds on its own (after an
        acquire that failed inside ``with Lock("a"):``, releasing ``a`` would
        free the outer hold while its block still runs)."""
        parts = tuple(lock for lock in self.locks if lock._handles.taken(lock) is not None)
        if not parts:
            raise LockNotOwnedError(f"{self!r} is not held by this holder.", name=self.names[0])
        return parts

    def release(self) -> None:
        """Release every part, in reverse order, even when one of them fails.

        Raises ``LockNotOwnedError`` when this handle holds none of the parts,
        and, after trying every part, the first ``LockLostError`` met (a part
        lost makes the whole set lost, whatever the others raised), else the
        first other error (``LockBackendError``).
        """
        first: BaseException | None = None
        for lock in reversed(self._held_parts()):
            try:
                lock.release()
            except Exception as exc:
                lost = isinstance(exc, LockLostError)
                if first is None or (lost and not isinstance(first, LockLostError)):
                    first = exc
        if first is not None:
            raise first

    def extend(self, seconds: float | None = None) -> None:
        """Reset every part's lease to ``seconds`` (default: the lease as it
        stands) from now; ``LockNotOwnedError`` when this handle holds none."""
        check_lease(seconds, "seconds")  # before anything else, held or not
        for lock in self._held_parts():
            lock.extend(seconds)

    def owned(self) -> bool:
        """Whether this holder holds every part, according to Redis."""
        return all(lock.owned() for lock in self.locks)

    def locked(self) -> bool:
        """Whether anyone holds any part (an acquire would have to wait)."""
        return any(lock.locked() for lock in self.locks)

    @property
    def fencing_tokens(self) -> dict[str, int]:
        """Each held part's fencing token, by name (empty when not held)."""
        return {
            lock.name: lock.fencing_token for lock in self.locks if lock.fencing_token is not None
        }

    def _timeout_error(self, result: AcquireResult) -> LockTimeout:
        """Names the part that could not be had, and the set it belongs to."""
        subject = f"Could not acquire lock {result.name!r} of {self!r} in time"
        return timeout_error(subject, result, result.name)
