"""What ``Lock`` and ``AsyncLock`` share, written once: the fair acquire's
steps (``engine/steps.py``), the nested re-entry, the release's arguments and
bookkeeping, and the hold's registry, watchdog and counters. No I/O here: the
sync driver (``primitives/lock.py``) and the asyncio one (``primitives/async_lock.py``) run the
steps and send the release.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, ClassVar

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import (
    LOCK_ACQUIRE,
    LOCK_CANCEL,
    LOCK_EXTEND,
    LOCK_FENCE,
    LOCK_PARTS,
    LOCK_RELEASE,
    LOCK_TAKE,
)
from django_redislock.engine import steps as protocol
from django_redislock.engine.steps import (
    HANDED,
    HELD_RESULT,
    NOT_OURS,
    AcquireResult,
    Call,
    Step,
    acquire_reply,
)
from django_redislock.holds import counters
from django_redislock.holds.holding import Holding
from django_redislock.holds.registry import Handles, HoldKey, supersede
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives import told
from django_redislock.primitives.base import WAITER_GRACE_MS, Primitive, Resolved
from django_redislock.primitives.first_step import First
from django_redislock.validation import fixed, wait_budget

#: The release script's ARGV for a holder's last level, but its token, and
#: where the token goes (``LOCK_RELEASE``'s call spec).
_FINAL_RELEASE = LOCK_RELEASE.args_of(token="", final=1)
_RELEASE_TOKEN = LOCK_RELEASE.arg_names.index("token")

#: Why a hold found gone when its holder acquired the name again is lost.
GONE_AT_REENTRY = "the lease was gone when the holder acquired it again"


class LockBase(Primitive):
    """What ``Lock`` and ``AsyncLock`` share: keys, script arguments, results."""

    #: The holder's bookkeeping (``holds/registry.py``), one for the class.
    _handles: ClassVar[Handles]

    kind = "lock"
    parts = LOCK_PARTS
    #: The Lock scripts work out the other keys from the lock key (``lock_keys``
    #: in ``backend/scripts/_lock_value.lua``): one key to encode per call, not five.
    script_parts = ("lock",)
    release_script = LOCK_RELEASE
    renew_script = LOCK_EXTEND

    @staticmethod
    def _waited(begun: float) -> int:
        """How long this acquire has waited so far, in ms, for the counters."""
        return int((time.monotonic() - begun) * 1000)

    #: Whether an acquire takes its fencing token at once (``fencing=True``)
    #: rather than on first use of ``fencing_token``.
    _fencing = False
    fencing: bool = fixed("fencing")
    #: The hold ``adopt()`` took through this handle, until a ``with`` block
    #: enters it (``primitives/detaching.py``).
    _adopted: Holding | None = None

    @staticmethod
    def _attempt_args(
        token: str,
        lease_ms: int,
        mode: str,
        fenced: bool,
        holder: str,
        waiter_ttl_ms: int,
        stats_ttl_ms: int,
        since_ms: int,
    ) -> dict[str, Any]:
        """The acquire script's ARGV by name, for a first attempt (no ``waited_ms`` yet)."""
        return {
            "token": token,
            "lease_ms": lease_ms,
            "mode": mode,
            "fenced": 1 if fenced else 0,
            "holder": holder,
            "since_ms": since_ms,
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
        pid: int | None = None,
    ) -> Holding:
        """``pid``: this process's, when the acquire has it."""
        holding = Holding(  # positionally: Holding's own order, a keyword call is slower
            type(self),  # sender
            self._name,  # name
            self.kind,
            token,
            holder,
            resolved.client,
            resolved.lease,
            started,
            fence,  # fencing_token
            LOCK_EXTEND,  # renew_script
            resolved.renew_keys,
            resolved.release_keys,
            "",  # sigprefix: a Lock's is worked out from its key
            resolved.stats_key,
            resolved.settings.stats_ttl_ms,
            pid,
        )
        # The last level's release: it frees the lock whatever count Redis
        # holds (see _release_args). Built from the spec's order once, per call
        # a copy with this token in its place.
        args = _FINAL_RELEASE.copy()
        args[_RELEASE_TOKEN] = token
        holding.release_args = args
        return holding

    @staticmethod
    def _release_args(holding: Holding) -> list[Any]:
        """The release script's ARGV for this holder's next release.

        The holder's own depth decides which release is the last, not the
        count in Redis, which can be one off either way: a nested acquire that
        timed out (Redis hung) may have been counted once Redis answered, and
        an inner release that failed is left by the holder (``_release_failed``)
        whether or not Redis ran it. The last release frees the lock anyway,
        and an inner one never does (``backend/scripts/lock_release.lua``).
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
        signals.announce_released(self, holding.acquired_at)

    def _release_failed(self, holding: Holding) -> None:
        """Redis could not be told (or its answer was lost, or the release
        was cancelled). An inner level is left all the same, as its block
        was: kept, the outer release was sent as an inner one, which never
        frees the lock, and the watchdog renewed it for as long as the thread
        lived. The last level: stop renewing, so the lease frees the lock."""
        if holding.depth > 1:
            holding.depth -= 1
        else:
            holding.end()

    # the acquire, written once for Lock and AsyncLock (see engine/steps.py) ---------------

    def _nest_steps(
        self, resolved: Resolved, holding: Holding, deadline: float | None
    ) -> Generator[Step, Any, bool]:
        """Re-enter this holder's ``holding`` (the script's ``nest`` mode, with
        its lease renewed); ``False`` when it was found gone (then superseded).

        Bounded by the acquire's ``deadline`` like any attempt. A nest Redis
        runs after the client gave up leaves Redis's count one above the
        holder's depth, which the holder's last release ignores (``final``).
        A handle that asks for its fencing token up front gets it here when
        the outer hold has none yet (one more round trip)."""
        nest = self._attempt_args(
            holding.token, int(holding.lease * 1000), "nest", False, holding.holder, 0,
            resolved.settings.stats_ttl_ms, 0,
        )  # fmt: skip
        call = Call(LOCK_ACQUIRE, resolved.keys_for(LOCK_ACQUIRE), LOCK_ACQUIRE.args_of(**nest))
        reply = yield from protocol.single(protocol.bounded(call, deadline), self.name)
        if acquire_reply(reply)[0] == NOT_OURS:
            supersede(holding, GONE_AT_REENTRY)
            return False
        holding.depth += 1
        self._handles.took(self, resolved.hold_key, holding)
        if self._fencing and not holding.fencing_token:
            yield from self._fence_steps(holding, deadline)
        return True

    def _fence_steps(
        self, holding: Holding, deadline: float | None = None
    ) -> Generator[Step, Any, int]:
        """The fencing token of ``holding``, taken now when it has none yet
        (``backend/scripts/lock_fence.lua``: one owner-checked round trip);
        ``LockLostError`` when the hold is gone, or was found lost before.
        ``deadline``: a nested acquire's, which bounds this step too."""
        if holding.fencing_token:
            return holding.fencing_token
        if holding.lost is not None:
            raise self._lost(holding)
        call = protocol.bounded(Call(LOCK_FENCE, holding.keys, (holding.token,)), deadline)
        fence = yield from protocol.single(call, self.name)
        if not fence:
            holding.mark_lost("the lease was gone when its fencing token was taken")
            raise self._lost(holding)
        holding.fencing_token = int(fence)
        return holding.fencing_token

    def _first_attempt(
        self,
        resolved: Resolved,
        blocking: bool | None,
        blocking_timeout: float | None,
        begun: float,
    ) -> First:
        """An acquire up to its first step, which its driver (``Lock._acquire``,
        ``AsyncLock._acquire``) sends by ``drivers.perform``, no generator: unless
        this holder holds the name already (``First.nest``) or the handle asks
        for its fencing token up front, one plain ``SET NX PX`` of the value an
        unfenced grant holds (``First.take``). Taken: ``_held_at_once``. Any
        other outcome, an exception included, continues in ``_after_first``."""
        handles = self._handles
        registry = handles.registry()
        pid = registry.pid  # this process's: the registry just checked (one system call)
        if resolved.auto_renew:  # no thread, no grant (watchdog.ensure_running)
            watchdog.ensure_running(pid)
        may_wait, budget = wait_budget(self, blocking, blocking_timeout, resolved.settings)
        deadline = None if budget is None else begun + budget
        first = First(resolved, registry, may_wait, begun, deadline)
        first.nest = handles.reentry(resolved.hold_key, registry)
        if first.nest is None:
            first.fresh(None if self._fencing else LOCK_TAKE)
        return first

    def _after_first(
        self, first: First, error: BaseException | None = None
    ) -> Generator[Step, Any, AcquireResult]:
        """The acquire's protocol after a first step that did not take the
        lock: ``error`` from the ``SET`` (cleaned up as an attempt is, by its
        token: a lost reply may have left it set; a full pool never sent it),
        a re-entry (``_nest_steps``), or the lock found taken, or fenced up
        front: the acquire script (``_contended_steps``), which queues the
        caller, or grants the lock when it was freed since or is already this
        token's (a SET whose reply was lost, and which redis-py's retry sent
        again)."""
        if isinstance(error, backend.PoolExhausted):  # never sent: nothing to clean up
            if first.deadline is None:
                raise backend.exhausted_error(self.name, error) from error
            counters.contended(self.name, time.monotonic() - first.begun)
            signals.announce_contended(self, first.begun, first.may_wait)
            return AcquireResult(False)  # the budget ran out: a timeout (engine/pool.py)
        if error is not None:  # cleaned up as an attempt is (engine/steps.py)
            cancel = self._cancel(first.resolved.release_keys, first.token)
            yield from protocol.interrupted(self.name, cancel, first.deadline, error)
        resolved = first.resolved
        if first.nest is not None:
            if (yield from self._nest_steps(resolved, first.nest, first.deadline)):
                return HELD_RESULT
            first.fresh(None)  # found gone: acquired afresh, by the script
        return (yield from self._contended_steps(first))

    def _contended_steps(self, first: First) -> Generator[Step, Any, AcquireResult]:
        """The acquire script's part (``engine/steps.acquire``): after a SET
        that found the lock taken, or the whole acquire when the caller asked
        for its fencing token up front."""
        # a handoff's first lease (backend/scripts/lock_acquire.lua): without a watchdog
        # the next attempt takes it instead, with the full lease
        resolved, may_wait, begun = first.resolved, first.may_wait, first.begun
        waiter_ttl_ms = int(resolved.chunk * 1000) + WAITER_GRACE_MS
        grant = min(resolved.lease_ms, waiter_ttl_ms) / 1000 if resolved.auto_renew else 0.0
        args = self._attempt_args(
            first.token, resolved.lease_ms, "wait" if may_wait else "try", self._fencing,
            first.holder, waiter_ttl_ms, resolved.settings.stats_ttl_ms, first.since_ms,
        )  # fmt: skip
        attempt = self._attempt(resolved, args, may_wait, first.deadline, grant, begun)
        outcome = yield from protocol.acquire(attempt)
        if not outcome.held:
            refused = AcquireResult.refused(outcome.value, outcome.refusal)
            counters.contended(self.name, time.monotonic() - begun)
            signals.announce_contended(self, begun, may_wait, refused.holder, refused.held_for)
            return refused
        holding = self._new_holding(
            first.token, first.holder, resolved, outcome.started, outcome.value, first.registry.pid
        )
        self._held(holding, resolved, outcome, grant, begun)
        return HELD_RESULT

    @staticmethod
    def _cancel(keys: list[bytes], token: str) -> Call:
        """The cancel script's call for ``token``'s attempt on a lock whose
        release takes ``keys``: it leaves the queue and passes on a lock the
        attempt was granted or handed, the clean-up after an interruption."""
        return Call(LOCK_CANCEL, keys, LOCK_CANCEL.args_of(token=token))

    def _attempt(
        self,
        resolved: Resolved,
        args: dict[str, Any],
        may_wait: bool,
        deadline: float | None,
        grant: float,
        begun: float,
    ) -> protocol.Attempt:
        """The fair acquire's attempt for a new hold: ``args`` named as the
        acquire script names them."""
        acquire_keys = resolved.keys_for(LOCK_ACQUIRE)
        cancel = self._cancel(resolved.release_keys, args["token"])
        return protocol.Attempt(
            name=self.name,
            call=Call(LOCK_ACQUIRE, acquire_keys, LOCK_ACQUIRE.args_of(**args)),
            parse=acquire_reply,
            leave=cancel,
            undo=cancel,
            signal_key=resolved.sigprefix + args["token"],
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

    def _held_at_once(self, first: First) -> AcquireResult:
        """``_held`` for a hold its first step took (the plain SET): no
        wait, no fencing token, nothing to build for either."""
        resolved = first.resolved
        registry = first.registry
        holding = self._new_holding(
            first.token, first.holder, resolved, first.begun, 0, registry.pid
        )
        self._handles.took(self, resolved.hold_key, holding, registry)
        if self._loss is not None or resolved.max_hold is not None:
            told.attach_hooks(self, holding, resolved)
        if resolved.auto_renew:
            watchdog.watch(holding)
        stats_key = resolved.stats_key
        if stats_key is not None:  # else counting is off
            ttl_ms = resolved.settings.stats_ttl_ms
            counters.acquired(resolved.client, stats_key, ttl_ms, self.name, 0.0, holding.pid)
        signals.announce_acquired(self, 0.0, None)
        return HELD_RESULT

    def _held(
        self,
        holding: Holding,
        resolved: Resolved,
        outcome: protocol.Outcome,
        grant: float,
        begun: float,
    ) -> None:
        """Bookkeeping of a new hold: registry, watchdog, counters, ``lock_acquired``."""
        if outcome.status == HANDED:  # a short first lease, which the watchdog renews soon
            holding.lease_deadline = outcome.started + grant
        self._handles.took(self, resolved.hold_key, holding)
        if self._loss is not None or resolved.max_hold is not None:
            told.attach_hooks(self, holding, resolved)
        if resolved.auto_renew:
            watchdog.watch(holding)
        # a handoff came after `started` (see protocol.acquire); the wait ended now
        ended = time.monotonic() if outcome.status == HANDED else outcome.started
        # only time spent in line is a wait: a pause before the first attempt (a
        # new connection pool, a busy CPU) made an uncontended acquire a wait
        waited = ended - begun if outcome.waited else 0.0
        if resolved.stats_key is not None:
            ttl_ms = resolved.settings.stats_ttl_ms
            counters.acquired(resolved.client, resolved.stats_key, ttl_ms, self.name, waited)
        signals.announce_acquired(self, waited, outcome.value or None)

    # holders: see ``holds/registry.py`` ------------------------------------------------------

    def _own_hold_key(self) -> HoldKey:
        """(cache alias, lock key): what the holder's registry knows the name by."""
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        return (self.using or settings.cache, keys[0])

    def _holding(self) -> Holding | None:  # what its release, extend and owned() apply to
        return self._handles.current(self, None)

    _hold_now = _holding
