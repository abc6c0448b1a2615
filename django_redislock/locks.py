"""``Lock``: an exclusive, reentrant, fair, fenced lease on a name.

Round trips: an uncontended acquire is one ``EVALSHA``; a release is one. A
waiter adds one ``BLPOP`` per wake-up and one re-check, and one ``EVALSHA`` to
leave the queue if it gives up.

Timeline of a handoff, which is why waiters queue in the script::

    A holds         B: acquire -> refused, queued     B: BLPOP signal:B ...
    A: release -> DEL lock, RPUSH signal:B            B: wakes -> acquire -> held
    A: acquire again at once -> refused (B is first in line), queued behind

Without the queue a releaser that re-acquires at once wins nearly every race
against a waiter that first has to wake up, and other processes starve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Sequence
from typing import Any

from . import backend, drivers, protocol
from .base import FENCE_MEMORY_MS, WAITER_GRACE_MS, Primitive, Resolved, SyncPrimitive
from .holders import Registry, thread_registry
from .holding import Holding, current_pid, holder_description, new_token
from .protocol import HANDED, HELD, REFUSED, Call, Step
from .scripts import LOCK_ACQUIRE, LOCK_CANCEL, LOCK_EXTEND, LOCK_RELEASE
from .state import parse_lock_value
from .watchdog import watchdog

logger = logging.getLogger(__name__)

ACQUIRED, NOT_OURS = HELD, -1


def acquire_reply(reply: int) -> tuple[int, int]:
    """``(status, value)`` of the acquire script's one-integer reply.

    Held: the fencing token (> 0); 0: a reentrant acquire found the lock no
    longer ours; below 0: refused, with a retry hint of ``-1 - reply`` ms.
    """
    if reply > 0:
        return ACQUIRED, reply
    if reply == 0:
        return NOT_OURS, 0
    return REFUSED, -1 - reply


#: Why a hold found gone when its holder acquired the name again is lost.
GONE_AT_REENTRY = "the lease was gone when the holder acquired it again"


class LockBase(Primitive):
    """What ``Lock`` and ``AsyncLock`` share: keys, script arguments, results."""

    kind = "lock"
    parts = ("lock", "fence", "queue", "deadlines", "stats")

    @staticmethod
    def _release_keys(keys: Sequence[Any]) -> list[Any]:
        """The release and cancel scripts' keys: lock, queue, deadlines, fence, stats."""
        return [keys[0], keys[2], keys[3], keys[1], keys[4]]

    @staticmethod
    def _release_args(token: str | bytes, sigprefix: str | bytes, stats_ttl_ms: int) -> list[Any]:
        return [token, sigprefix, FENCE_MEMORY_MS, stats_ttl_ms]

    @staticmethod
    def _grant_ms(lease_ms: int, waiter_ttl_ms: int) -> int:
        """First lease of a handoff to this waiter (``scripts/_handoff.lua``): no
        longer than a dead waiter would block the queue anyway."""
        return min(lease_ms, waiter_ttl_ms)

    def _acquire_args(
        self,
        token: str,
        lease_ms: int,
        mode: str,
        waiter_ttl_ms: int,
        sigprefix: str,
        holder: str,
        stats_ttl_ms: int,
        grant_ms: int = 0,
    ) -> list[Any]:
        return [
            token,
            lease_ms,
            mode,
            waiter_ttl_ms,
            sigprefix,
            holder,
            FENCE_MEMORY_MS,
            int(time.time() * 1000),
            stats_ttl_ms,
            -1,  # waited_ms: first attempt; see _waited
            grant_ms,
        ]

    @staticmethod
    def _waited(args: list[Any], begun: float) -> None:
        """Tell the next attempt how long this acquire has waited, for the counters."""
        args[9] = int((time.monotonic() - begun) * 1000)

    def _new_holding(
        self,
        token: str,
        holder: str,
        client: Any,
        lease: float,
        started: float,
        fence: int,
        release_keys: list[Any],
        sigprefix: str | bytes,
        stats_ttl_ms: int,
    ) -> Holding:
        """``release_keys``: ``_release_keys`` of the lock's keys (stats last)."""
        return Holding(
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=token,
            holder=holder,
            client=client,
            lease=lease,
            started=started,
            fencing_token=fence,
            renew_script=LOCK_EXTEND,
            keys=release_keys,
            sigprefix=sigprefix,
            stats_key=release_keys[4] if stats_ttl_ms else None,
            stats_ttl_ms=stats_ttl_ms,
        )

    def _after_release(self, holding: Holding, result: int) -> None:
        """Bookkeeping once the release script answered ``result``; raises when lost."""
        if result == NOT_OURS:
            holding.mark_lost("the lease was gone when the holder released it")
            holding.end()
            raise self._lost(holding)
        holding.depth -= 1
        if holding.depth > 0:
            return
        lost = holding.lost
        holding.end()
        if lost is not None:
            raise self._lost(holding)
        self._announce_released(holding)

    def _release_failed(self, holding: Holding) -> None:
        """Redis could not be told: stop renewing, so the lease frees the lock."""
        if holding.depth <= 1:
            holding.end()

    # the acquire, written once for Lock and AsyncLock (see protocol.py) ---------------

    def _acquire_steps(
        self, resolved: Resolved, blocking: bool | None, blocking_timeout: float | None
    ) -> Generator[Step, Any, int | None]:
        """Acquire; ``None`` when held, else the server's retry hint in ms."""
        settings, keys = resolved.settings, resolved.wire_keys
        hold_key = self._hold_key(resolved.alias, resolved.keys[0])
        holding = self._reentry(hold_key)
        if holding is not None:
            nest = self._acquire_args(
                holding.token, int(holding.lease * 1000), "nest", 0, resolved.sigprefix,
                holding.holder, settings.stats_ttl_ms,
            )  # fmt: skip
            reply = yield from protocol.single(Call(LOCK_ACQUIRE, keys, nest), self.name)
            if acquire_reply(reply)[0] != NOT_OURS:
                holding.depth += 1
                self._took(hold_key, holding)
                return None
            self._supersede(holding, GONE_AT_REENTRY)

        may_wait, budget = self._wait_budget(blocking, blocking_timeout, settings)
        token, begun, holder = new_token(), time.monotonic(), holder_description()
        waiter_ttl_ms = int(resolved.chunk * 1000) + WAITER_GRACE_MS
        grant_ms = self._grant_ms(resolved.lease_ms, waiter_ttl_ms)
        args = self._acquire_args(
            token, resolved.lease_ms, "wait" if may_wait else "try", waiter_ttl_ms,
            resolved.sigprefix, holder, settings.stats_ttl_ms, grant_ms,
        )  # fmt: skip
        release_keys = self._release_keys(keys)
        release_args = self._release_args(token, resolved.wire_sigprefix, settings.stats_ttl_ms)
        # The cancel script leaves the queue and passes on a lock the attempt
        # was granted or handed: the clean-up after an interruption, too.
        cancel = Call(LOCK_CANCEL, release_keys, release_args)
        outcome = yield from protocol.acquire(
            protocol.Attempt(
                name=self.name,
                call=Call(LOCK_ACQUIRE, keys, args),
                parse=acquire_reply,
                leave=cancel,
                undo=cancel,
                signal_key=resolved.sigprefix + token,
                chunk=resolved.chunk,
                may_wait=may_wait,
                deadline=None if budget is None else begun + budget,
                # without a watchdog the next attempt takes it, with the full lease
                handoff_lease=grant_ms / 1000 if resolved.auto_renew else 0.0,
                on_wait=lambda: self._waited(args, begun),
            )
        )
        if not outcome.held:
            self._announce_contended(begun)
            return outcome.value
        holding = self._new_holding(
            token, holder, resolved.client, resolved.lease, outcome.started, outcome.value,
            release_keys, resolved.wire_sigprefix, settings.stats_ttl_ms,
        )  # fmt: skip
        holding.release_args = release_args
        if outcome.status == HANDED:  # a short first lease, which the watchdog renews soon
            holding.lease_deadline = outcome.started + grant_ms / 1000
        self._took(hold_key, holding)
        if resolved.auto_renew:
            watchdog.watch(holding)
        # a handoff came after `started` (see protocol.acquire); the wait ended now
        ended = time.monotonic() if outcome.status == HANDED else outcome.started
        self._announce_acquired(ended - begun, outcome.value)
        return None

    # holders: see ``holders.py`` ------------------------------------------------------

    def _entered(self) -> list[Holding]:
        """The holds this handle took or re-entered in the current holder, latest last."""
        raise NotImplementedError

    def _registry(self) -> Registry[Holding]:
        raise NotImplementedError

    def _hold_key(self, alias: str, key: str) -> tuple[str, str]:
        return (alias, key)

    def _current(self, key: tuple[str, str] | None) -> Holding | None:
        """The hold a release, extend or ``owned`` of this handle applies to: the
        latest one it took, else the current holder's hold of the name (taken
        through another handle); ``key`` is ``_hold_key`` when it is at hand."""
        entered = self._entered()
        while entered and not entered[-1].active and entered[-1].lost is None:
            entered.pop()  # released to the end through another handle
        if entered:
            return entered[-1]
        if key is None:
            key = self._own_hold_key()
        return self._registry().get(key)

    def _own_hold_key(self) -> tuple[str, str]:
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        return self._hold_key(self.using or settings.cache, keys[0])

    def _reentry(self, key: tuple[str, str]) -> Holding | None:
        """The current holder's live hold of the name, to nest into; a hold
        already known lost is reported once more, forgotten and not nested into
        (the caller acquires afresh; the handle that took it is told at its
        release)."""
        holding = self._registry().get(key)
        if holding is not None and holding.lost is not None:
            self._supersede(holding, holding.lost)
            return None
        return holding

    @staticmethod
    def _supersede(holding: Holding, reason: str) -> None:
        """Report ``holding`` lost and end it: its holder no longer holds it."""
        holding.mark_lost(reason)
        holding.end()

    def _took(self, key: tuple[str, str], holding: Holding) -> None:
        """Record a new or re-entered hold for this handle and its holder."""
        if holding.depth == 1:
            self._registry().put(key, holding)
        self._entered().append(holding)

    def _left(self, holding: Holding) -> None:
        """After a release of ``holding`` through this handle, whatever its outcome."""
        entered = self._entered()
        if not holding.active:
            entered[:] = [h for h in entered if h is not holding]
        elif entered and entered[-1] is holding:
            entered.pop()


class Lock(LockBase, SyncPrimitive):
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
    release (see ``holders.py``).
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
    ) -> None:
        super().__init__(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            using=using,
        )
        self._local = threading.local()

    # holder state: see holders.py ---------------------------------------------------

    def _entered(self) -> list[Holding]:
        entered: list[Holding] | None = getattr(self._local, "entered", None)
        if entered is None or (entered and entered[0].pid != current_pid()):
            entered = self._local.entered = []  # new thread, or inherited through fork()
        return entered

    def _registry(self) -> Registry[Holding]:
        return thread_registry()

    def _holding(self) -> Holding | None:
        """The hold this handle's release, extend and ``owned`` apply to."""
        return self._current(None)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current thread's hold (``None`` when not held)."""
        holding = self._holding()
        return holding.fencing_token if holding is not None else None

    # acquire ----------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock; ``False`` when it could not be taken in time.

        Raises ``LockBackendError`` when Redis cannot be reached, and
        ``LockLostError`` when a nested acquire finds the outer hold lost.
        """
        return self._acquire(blocking, blocking_timeout) is None

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> int | None:
        """Acquire; ``None`` when held, else the server's retry hint in ms."""
        resolved = self._resolve()
        steps = self._acquire_steps(resolved, blocking, blocking_timeout)
        return drivers.run(steps, resolved.client)

    # release, extend, inspect ---------------------------------------------------------

    def release(self) -> None:
        """Release one level of this holder's hold.

        Raises ``LockNotOwnedError`` when this holder does not hold the lock and
        ``LockLostError`` when it did but the lease was lost in the meantime.
        """
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        holding.releasing = holding.depth <= 1
        try:
            try:
                result = LOCK_RELEASE(holding.client, holding.keys, holding.release_args)
            except BaseException as exc:
                self._release_failed(holding)
                if isinstance(exc, backend.BACKEND_ERRORS):
                    raise backend.backend_error(self.name, exc) from exc
                raise
            self._after_release(holding, result)
        finally:
            self._left(holding)

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
