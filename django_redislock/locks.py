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
from collections.abc import Generator
from typing import Any

from . import backend, counters, drivers, protocol
from .base import WAITER_GRACE_MS, Primitive, Resolved, SyncPrimitive
from .holders import Handle, Registry, thread_registry
from .holding import Holding, current_pid, holder_description, new_token
from .protocol import HANDED, HELD, HELD_RESULT, REFUSED, AcquireResult, Call, Step
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


class LockBase(Handle, Primitive):
    """What ``Lock`` and ``AsyncLock`` share: keys, script arguments, results."""

    kind = "lock"
    parts = ("lock", "fence", "queue", "deadlines", "stats")
    #: The Lock scripts work out the other keys from the lock key (``lock_keys``
    #: in ``scripts/_lock_value.lua``): one key to encode per call, not five.
    script_parts = ("lock",)

    @staticmethod
    def _waited(begun: float) -> int:
        """How long this acquire has waited so far, in ms, for the counters."""
        return int((time.monotonic() - begun) * 1000)

    @staticmethod
    def _attempt_args(
        token: str, lease_ms: int, mode: str, holder: str, waiter_ttl_ms: int, stats_ttl_ms: int
    ) -> dict[str, Any]:
        """The acquire script's ARGV by name, for a first attempt (no ``waited_ms`` yet)."""
        return {
            "token": token,
            "lease_ms": lease_ms,
            "mode": mode,
            "holder": holder,
            "since_ms": int(time.time() * 1000),
            "waiter_ttl_ms": waiter_ttl_ms,
            "stats_ttl_ms": stats_ttl_ms,
        }

    def _new_holding(
        self,
        token: str,
        holder: str,
        resolved: Resolved,
        started: float,
        fence: int,
        release: Call,
    ) -> Holding:
        """``release``: the release script's call for this holding."""
        holding = Holding(
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=token,
            holder=holder,
            client=resolved.client,
            lease=resolved.lease,
            started=started,
            fencing_token=fence,
            renew_script=LOCK_EXTEND,
            renew_keys=resolved.keys_for(LOCK_EXTEND),
            keys=release.keys,
            stats_key=resolved.stats_key,
            stats_ttl_ms=resolved.settings.stats_ttl_ms,
        )
        # The last level's release: it frees the lock whatever count Redis
        # holds (see _release_args).
        holding.release_args = LOCK_RELEASE.args_of(token=token, final=1)
        return holding

    @staticmethod
    def _release_args(holding: Holding) -> list[Any]:
        """The release script's ARGV for this holder's next release.

        The holder's own depth decides which release is the last, not the
        count in Redis, which can be one off either way: a nested acquire that
        timed out (Redis hung) may have been counted once Redis answered, and
        a release whose reply was lost may have been counted though the
        holder keeps its level. The last release frees the lock anyway, and
        an inner one never does (``scripts/lock_release.lua``).
        """
        if holding.depth > 1:
            return LOCK_RELEASE.args_of(token=holding.token)
        return holding.release_args

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

    def _nest_steps(
        self,
        resolved: Resolved,
        hold_key: tuple[str, str],
        holding: Holding,
        deadline: float | None,
    ) -> Generator[Step, Any, bool]:
        """Re-enter this holder's ``holding`` (the script's ``nest`` mode, with
        its lease renewed); ``False`` when it was found gone (then superseded).

        Bounded by the acquire's ``deadline`` like any attempt. A nest Redis
        runs after the client gave up leaves Redis's count one above the
        holder's depth, which the holder's last release ignores (``final``)."""
        nest = self._attempt_args(
            holding.token, int(holding.lease * 1000), "nest", holding.holder, 0,
            resolved.settings.stats_ttl_ms,
        )  # fmt: skip
        call = Call(LOCK_ACQUIRE, resolved.keys_for(LOCK_ACQUIRE), LOCK_ACQUIRE.args_of(**nest))
        reply = yield from protocol.single(protocol.bounded(call, deadline), self.name)
        if acquire_reply(reply)[0] == NOT_OURS:
            self._supersede(holding, GONE_AT_REENTRY)
            return False
        holding.depth += 1
        self._took(hold_key, holding)
        return True

    def _acquire_steps(
        self, resolved: Resolved, blocking: bool | None, blocking_timeout: float | None
    ) -> Generator[Step, Any, AcquireResult]:
        """Acquire: held, or refused with the server's retry hint."""
        settings = resolved.settings
        may_wait, budget = self._wait_budget(blocking, blocking_timeout, settings)
        hold_key = self._hold_key(resolved.alias, resolved.keys[0])
        holding = self._reentry(hold_key)
        begun = time.monotonic()
        deadline = None if budget is None else begun + budget
        if holding is not None and (
            yield from self._nest_steps(resolved, hold_key, holding, deadline)
        ):
            return HELD_RESULT

        token, holder = new_token(), holder_description()
        waiter_ttl_ms = int(resolved.chunk * 1000) + WAITER_GRACE_MS
        args = self._attempt_args(
            token, resolved.lease_ms, "wait" if may_wait else "try", holder, waiter_ttl_ms,
            settings.stats_ttl_ms,
        )  # fmt: skip
        acquire_keys = resolved.keys_for(LOCK_ACQUIRE)
        release = Call(
            LOCK_RELEASE,
            resolved.keys_for(LOCK_RELEASE),
            LOCK_RELEASE.args_of(token=token),
        )
        # The cancel script leaves the queue and passes on a lock the attempt
        # was granted or handed: the clean-up after an interruption, too.
        cancel = Call(LOCK_CANCEL, release.keys, release.args)
        # a handoff's first lease (scripts/lock_acquire.lua): without a watchdog
        # the next attempt takes it instead, with the full lease
        grant = min(resolved.lease_ms, waiter_ttl_ms) / 1000 if resolved.auto_renew else 0.0
        outcome = yield from protocol.acquire(
            protocol.Attempt(
                name=self.name,
                call=Call(LOCK_ACQUIRE, acquire_keys, LOCK_ACQUIRE.args_of(**args)),
                parse=acquire_reply,
                leave=cancel,
                undo=cancel,
                signal_key=resolved.sigprefix + token,
                chunk=resolved.chunk,
                may_wait=may_wait,
                deadline=deadline,
                handoff_lease=grant,
                on_wait=lambda: Call(
                    LOCK_ACQUIRE,
                    acquire_keys,
                    LOCK_ACQUIRE.args_of(**args, waited_ms=self._waited(begun)),
                ),
            )
        )
        if not outcome.held:
            self._announce_contended(begun)
            return AcquireResult.refused(outcome.value)
        holding = self._new_holding(
            token, holder, resolved, outcome.started, outcome.value, release
        )
        self._held(hold_key, holding, resolved, outcome, grant, begun)
        return HELD_RESULT

    def _held(
        self,
        hold_key: tuple[str, str],
        holding: Holding,
        resolved: Resolved,
        outcome: protocol.Outcome,
        grant: float,
        begun: float,
    ) -> None:
        """Bookkeeping of a new hold: registry, watchdog, counters, ``lock_acquired``."""
        if outcome.status == HANDED:  # a short first lease, which the watchdog renews soon
            holding.lease_deadline = outcome.started + grant
        self._took(hold_key, holding)
        if resolved.auto_renew:
            watchdog.watch(holding)
        # a handoff came after `started` (see protocol.acquire); the wait ended now
        ended = time.monotonic() if outcome.status == HANDED else outcome.started
        if resolved.stats_key is not None:  # wait_ms counts only time spent in line
            waited = ended - begun if outcome.waited else 0.0
            counters.acquired(
                resolved.client, resolved.stats_key, resolved.settings.stats_ttl_ms, waited
            )
        self._announce_acquired(ended - begun, outcome.value)

    # holders: see ``holders.py`` ------------------------------------------------------

    def _own_hold_key(self) -> tuple[str, str]:
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        return self._hold_key(self.using or settings.cache, keys[0])


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
        return self._acquire(blocking, blocking_timeout).held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> AcquireResult:
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
                result = LOCK_RELEASE(holding.client, holding.keys, self._release_args(holding))
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
