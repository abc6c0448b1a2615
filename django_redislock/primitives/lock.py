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
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine import drivers, pool
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds import losses, tickets
from django_redislock.holds.holding import Holding
from django_redislock.holds.registry import THREAD_HANDLES
from django_redislock.primitives import guarded
from django_redislock.primitives.base import token_of
from django_redislock.primitives.detaching import (
    adopt_steps,
    adoptable,
    detach_steps,
    entered,
    entering,
    leaving,
)
from django_redislock.primitives.lock_common import LockBase
from django_redislock.validation import check_bool

_L = TypeVar("_L", bound="Lock")


class Lock(LockBase):
    """An exclusive lock on ``name``, shared by every process that uses the same Redis.

    Guarantees, as long as Redis keeps its data: at most one holder at a time; a
    holder can only release or extend its own claim; every acquire gets a
    fencing token greater than all earlier ones for the name; waiters are
    served in arrival order. The lease (``timeout``) bounds how long a crashed
    holder blocks others; with ``auto_renew`` the watchdog keeps a live
    holder's lease going. If the lease is lost anyway the holder is told
    (``lock_lost``, ``LockLostError``) rather than carrying on unaware.

    A holder may know of a loss while it still holds: ``lost`` (no round
    trip), ``check()``, and ``on_lost`` (called once, with this handle, on
    the process's loss-callback thread, never the watchdog's); ``max_hold``
    caps how long the watchdog renews (``holds/losses.py``).

    Reentrant per thread: the holder is the thread, not the ``Lock`` object.
    Any ``Lock`` for the same name and cache alias in the holding thread
    acquires again without waiting; the lock is freed by that thread's last
    release (see ``holds/registry.py``).
    """

    _handles = THREAD_HANDLES

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
        on_lost: Callable[[Any], object] | None = None,
        max_hold: float | None = None,
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
        if on_lost is not None or max_hold is not None:
            self._loss = losses.loss_options(on_lost, max_hold, False, asyncio_holds=False)
        #: what this handle entered, and its open blocks, in each thread
        #: (``THREAD_HANDLES``, ``_blocks``)
        self._local = threading.local()

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
        """The first step as a plain call (``LockBase._first_attempt``); only
        an outcome other than "taken" runs the protocol (``_after_first``)."""
        begun = time.monotonic()
        try:
            resolved = self._resolve()
            first = self._first_attempt(resolved, blocking, blocking_timeout, begun)
            if first.take is None:
                return drivers.run(self._after_first(first), resolved.client)
            try:
                took = drivers.perform(first.take, resolved.client, first=True)
            except BaseException as error:
                return drivers.run(self._after_first(first, error), resolved.client)
            if took:
                return self._held_at_once(first)
            return drivers.run(self._after_first(first), resolved.client)
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
        handles = self._handles
        entered = handles.entered(self)
        holding = handles.taken(self, entered) or handles.current(self, None)
        if holding is None:
            raise self._not_owned()
        holding.releasing = holding.depth <= 1
        sent = time.monotonic()
        try:
            result = pool.send(
                LOCK_RELEASE, holding.client, holding.keys, self._release_args(holding)
            )
        except BaseException as error:
            self._released(holding, sent, error=error)
        else:
            self._released(holding, sent, result)
        finally:
            handles.left(self, holding, entered)

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` (default: the lease as it stands) the lease from now on.

        The watchdog renews by the new lease until release, and so does a
        nested acquire. Below 1 ms is a ``ValueError``.
        """
        holding = self._holding()
        drivers.run(self._extend_steps(holding, seconds), holding.client if holding else None)

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        resolved = self._resolve()
        with backend.translate_errors(self.name):
            return bool(resolved.client.exists(resolved.keys[0]))

    def owned(self) -> bool:
        """Whether this holder holds the lock, according to Redis."""
        holding = self._holding()
        if holding is None:
            return False
        with backend.translate_errors(self.name):
            state = parse_lock_value(holding.client.get(holding.keys[0]))
        return state is not None and state.token == holding.token

    def ttl(self) -> float | None:
        """Seconds left on the current lease (anyone's), or ``None`` when free."""
        resolved = self._resolve()
        with backend.translate_errors(self.name):
            remaining = resolved.client.pttl(resolved.keys[0])
        return remaining / 1000.0 if remaining >= 0 else None

    # hand-over to another thread or process: see primitives/detaching.py ------------------

    def detach(self) -> str:
        """Hand this thread's hold off; a ticket for ``Lock.adopt``.

        After it the thread no longer holds the lock (leaving a ``with``
        block around the call releases nothing) and this process stops
        renewing it; the hold goes on, for one lease (``timeout``, or what
        ``extend()`` last made it) from now, until an adopter takes it over.
        The ticket is an ASCII string, signed with ``SECRET_KEY``, safe to
        pass through a task broker; whoever has it can adopt the hold, once.

        ``LockNotOwnedError`` when this thread does not hold it,
        ``LockLostError`` when its lease was lost, ``RuntimeError`` for a
        nested (reentrant) hold: only the outermost level can be handed off.
        """
        holding = self._holding()
        return drivers.run(detach_steps(self, holding), holding.client if holding else None)

    @classmethod
    def adopt(cls: type[_L], ticket: str, *, auto_renew: bool | None = None) -> _L:
        """Take over the hold ``ticket`` (from ``detach()``) stands for, in
        this thread, of any process: a ``Lock`` that holds it, renewed by
        this process's watchdog, extendable, with the hold's fencing token,
        released by ``release()`` or at the end of ``with Lock.adopt(t) as
        lock:``. The lease is the detached hold's; ``detach()`` hands it on
        again (a new ticket).

        Exactly one adopter gets it: ``LockLostError`` when the ticket was
        adopted already, forged or edited, or its lease ran out (the message
        says which); ``ImproperlyConfigured`` when this process's settings
        put the name's keys elsewhere than the detacher's.
        """
        found = tickets.loads(ticket)
        lock = cls(
            found.name, timeout=found.lease_ms / 1000, using=found.using, auto_renew=auto_renew
        )
        resolved = adoptable(lock, found)
        lock._adopted = drivers.run(adopt_steps(lock, found, resolved), resolved.client)
        return lock

    def _blocks(self) -> list[Holding]:
        """The holds this handle's open ``with`` blocks entered in this thread."""
        blocks: list[Holding] | None = getattr(self._local, "blocks", None)
        if blocks is None:
            blocks = self._local.blocks = []
        return blocks

    def __enter__(self: _L) -> _L:
        blocks = self._blocks()
        if self._adopted is None or not entering(self, blocks):  # adopted: rare
            guarded.enter(self)
            entered(self, blocks)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not leaving(self, self._blocks()):
            guarded.leave(self, exc_type, exc)
