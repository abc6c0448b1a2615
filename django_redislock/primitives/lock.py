"""``Lock``: an exclusive, reentrant, fair, fenced lease on a name.

Round trips: an uncontended acquire is one plain ``SET NX PX``; a release is
one ``EVALSHA``. A contended acquire adds one ``EVALSHA`` that queues the
caller; a waiter adds one ``BLPOP`` per wake-up, and one ``EVALSHA`` to leave
the queue if it gives up. The fencing token costs one ``EVALSHA`` on first
use, or none when asked for up front (``fencing=True``: the acquire is then
the script itself).

Timeline of a handoff, which is why waiters queue in the script::

    A holds         B: SET NX -> fails; script -> queued   B: BLPOP signal:B ...
    A: release -> lock becomes B's, RPUSH signal:B         B: wakes holding it
    A: SET NX at once -> fails (the lock is B's); queued behind B

The lock is never free while waiters are queued and holders release
normally, so a newcomer's ``SET NX`` cannot jump the queue. Only a lease that
runs out with waiters queued leaves it free until the first waiter re-checks
(``docs/guarantees.md``).
"""

from __future__ import annotations

import threading
import time

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine import drivers
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding
from django_redislock.holds.registry import ThreadHandle
from django_redislock.primitives.base import token_of
from django_redislock.primitives.guarded import Guarded
from django_redislock.primitives.lock_common import LockBase
from django_redislock.validation import check_bool


class Lock(ThreadHandle, LockBase, Guarded):
    """An exclusive lock on ``name``, shared by every process that uses the same Redis.

    Guarantees, as long as Redis keeps its data: at most one holder at a time; a
    holder can only release or extend its own claim; every acquire gets a
    fencing token greater than all earlier ones for the name; waiters are
    served in arrival order. The lease (``timeout``) bounds how long a crashed
    holder blocks others; with ``auto_renew`` the watchdog keeps a live
    holder's lease going. If the lease is lost anyway the holder is told
    (``lock_lost``, ``LockLostError``) rather than carrying on unaware.

    Reentrant per thread: the holder is the thread, not the ``Lock`` object.
    Any ``Lock`` for the same name and cache alias in the holding thread
    acquires again without waiting; the lock is freed by that thread's last
    release (see ``holds/registry.py``).
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
        fencing: bool = False,
    ) -> None:
        super().__init__(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
        )
        self._fencing = (
            fencing
            if type(fencing) is bool
            else bool(check_bool(fencing, "fencing", allow_none=False))
        )
        self._local = threading.local()

    # holder state: see holds/registry.py ---------------------------------------------------

    def _holding(self) -> Holding | None:
        """The hold this handle's release, extend and ``owned`` apply to."""
        return self._current(None)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current thread's hold (``None`` when not held).

        Larger than every token given out earlier for the name. Taken on
        first use, by one owner-checked round trip, unless the lock was built
        with ``fencing=True`` (then the acquire took it) or was handed over
        by a release (which gives one); read again, the same token, with no
        round trip. Raises ``LockLostError`` when the hold is found gone: a
        lost hold gets no token.
        """
        return token_of(self._holding(), self._fence_steps)

    # acquire ----------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock; ``False`` when it could not be taken in time.

        Raises ``LockBackendError`` when Redis cannot be reached, and
        ``LockLostError`` when a nested acquire finds the outer hold lost.
        """
        return self._acquire(blocking, blocking_timeout).held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> AcquireResult:
        begun = time.monotonic()
        try:
            resolved = self._resolve()
            steps = self._acquire_steps(resolved, blocking, blocking_timeout)
            return drivers.run(steps, resolved.client)
        except LockBackendError as exc:
            signals.announce_failed(self, begun, exc)
            raise

    # release, extend, inspect ---------------------------------------------------------

    def release(self) -> None:
        """Release one level of this holder's hold.

        Raises ``LockNotOwnedError`` when this holder does not hold the lock and
        ``LockLostError`` when it did but the lease was lost in the meantime,
        also when Redis cannot be reached to release it and the lease had
        ended by this holder's clock before the release was sent (or was
        reported lost): then ``LockBackendError`` is chained. Otherwise an
        unreachable Redis is a ``LockBackendError``; the lease frees the lock.
        """
        entered = self._entered()
        holding = self._taken(entered) or self._current(None)
        if holding is None:
            raise self._not_owned()
        holding.releasing = holding.depth <= 1
        sent = time.monotonic()
        try:
            try:
                result = LOCK_RELEASE(holding.client, holding.keys, self._release_args(holding))
            except backend.BACKEND_ERRORS as exc:
                error = self._unreachable(holding, exc, sent, "released it")
                self._release_failed(holding)
                raise error from error.__cause__
            except BaseException:
                self._release_failed(holding)
                raise
            self._after_release(holding, result)
        finally:
            self._left(holding, entered)

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` (default: the lease as it stands) the lease from now on.

        The watchdog renews by the new lease until release, and so does a
        nested acquire. Below 1 ms is a ``ValueError``.
        """
        holding = self._holding()
        drivers.run(self._extend_steps(holding, seconds), holding.client if holding else None)

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        with backend.translate_errors(self.name):
            return bool(self._client(settings).exists(keys[0]))

    def owned(self) -> bool:
        """Whether this holder holds the lock, according to Redis."""
        holding = self._holding()
        if holding is None:
            return False
        keys, _ = self._key_set(self._prefix(self._settings()))
        with backend.translate_errors(self.name):
            state = parse_lock_value(holding.client.get(keys[0]))
        return state is not None and state.token == holding.token

    def ttl(self) -> float | None:
        """Seconds left on the current lease (anyone's), or ``None`` when free."""
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        with backend.translate_errors(self.name):
            remaining = self._client(settings).pttl(keys[0])
        return remaining / 1000.0 if remaining >= 0 else None
