"""What every primitive with several holders shares: permits.

A permit is one holder's claim on a ``Semaphore`` or a ``ReadWriteLock``
side: its own token, lease and fencing token, a member of the primitive's
holder ZSET (see ``backend/scripts/_permits.lua``). The sync and async APIs share
everything but the I/O: the acquire is ``PermitBase._acquire_steps``, run by
the drivers (``engine/steps.py``, ``engine/drivers.py``); the I/O is
``sync_permits.PermitPrimitive``'s and ``async_permits.AsyncPermitPrimitive``'s.
Each acquire takes a permit of its own, as ``threading.Semaphore`` does; a
permit belongs to the handle (in its thread or task) that took it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from django_redislock import signals
from django_redislock.backend.scripts import (
    PERMIT_CANCEL,
    PERMIT_DESCRIBE,
    PERMIT_EXTEND,
    PERMIT_FENCE,
    PERMIT_RELEASE,
    Script,
)
from django_redislock.backend.values import HolderInfo
from django_redislock.engine import steps as protocol
from django_redislock.engine.steps import (
    HELD,
    HELD_RESULT,
    REFUSED,
    AcquireResult,
    Call,
    Outcome,
    Step,
    permit_reply,
)
from django_redislock.holds import counters, losses
from django_redislock.holds.holding import Holding, holder_description, new_token
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives import told
from django_redislock.primitives.base import (
    WAITER_GRACE_MS,
    Primitive,
    Resolved,
)
from django_redislock.validation import check_bool


class PermitBase(Primitive):
    """A primitive whose holders each get a permit: its own token and lease.

    Their keys are, in this order: the holder ZSET (the main part, see
    ``backend/scripts/_permits.lua``), the fencing counter, the wait queue and its
    deadlines (``roles``: the names the scripts' specs give them). Subclasses
    name their parts and scripts; the acquire script answers ``{1, fence}`` (or
    the bare fence; 0 when none was taken) or ``{0, retry hint}`` (or a
    subclass-specific status, see ``permit_reply``), the release script ``1``
    (released) or ``0`` (the lease was already gone). The sync and async APIs
    share everything but the I/O.

    The fencing token costs nothing unless used: an acquire takes it only
    when the handle was built with ``fencing=True``; otherwise its first use
    takes it (``_fence_steps``, one owner-checked round trip).
    """

    roles = ("holders", "fence", "queue", "deadlines")
    acquire_script: Script
    release_script: Script = PERMIT_RELEASE
    #: First character of every token, when the scripts need to see the mode.
    token_mode = ""

    def __init__(
        self,
        name: str,
        *,
        fencing: bool = False,
        on_lost: Callable[[Any], object] | None = None,
        max_hold: float | None = None,
        cancel_on_loss: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        self._fencing = bool(check_bool(fencing, "fencing", allow_none=False))
        if on_lost is not None or max_hold is not None or cancel_on_loss is not False:
            self._loss = losses.loss_options(
                on_lost, max_hold, cancel_on_loss, asyncio_holds=self.asyncio_holds
            )

    def _member_limit(self) -> int:
        """Carried by every holder's member: a Semaphore's limit; 0 when unused."""
        return 0

    def _on_status(self, status: int, value: int) -> None:
        """A status other than granted or refused: raise the matching error."""
        raise RuntimeError(f"unexpected answer {status!r} from {self.acquire_script!r}")

    def _stack(self) -> list[Holding]:
        """This holder's permits, latest last."""
        raise NotImplementedError

    def _latest(self) -> Holding | None:
        """This holder's latest permit (``None`` when none)."""
        stack = self._stack()
        return stack[-1] if stack else None

    def _hold_now(self) -> Holding | None:
        return self._latest()

    def _fence_steps(self, holding: Holding) -> Generator[Step, Any, int]:
        """The fencing token of ``holding``, taken now when it has none yet
        (``backend/scripts/permit_fence.lua``: one owner-checked round trip,
        which writes the token into the permit's member, so the holding's
        member changes with it); ``LockLostError`` when the permit is gone,
        or was found lost before."""
        if holding.fencing_token:
            return holding.fencing_token
        if holding.lost is not None:
            raise self._lost(holding)
        holders = holding.keys[0]
        fence_key = self._sibling_key(holders, self.parts[1])
        call = Call(PERMIT_FENCE, (holders, fence_key), (holding.token,))
        fence = int((yield from protocol.single(call, self.name)))
        if not fence:
            holding.mark_lost("the lease was gone when its fencing token was taken")
            raise self._lost(holding)
        token, _, tail = holding.token.split(":", 2)
        holding.token = member = f"{token}:{fence}:{tail}"  # renewals send it from now on
        holding.release_args = self.release_script.args_of(member=member)
        holding.fencing_token = fence
        return fence

    def _sibling_key(self, holders: str | bytes, part: str) -> str | bytes:
        """The key of ``part`` beside the holder ZSET ``holders`` (under the
        prefix the permit was taken with, whatever the settings say now)."""
        cut = len(holders) - len(self.parts[0])
        if isinstance(holders, bytes):
            return holders[:cut] + part.encode()
        return holders[:cut] + part

    def _acquire_steps(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> Generator[Step, Any, AcquireResult]:
        """Acquire (``protocol.acquire``): held, or refused with the retry hint
        and, when every permit was taken, the holder whose lease ends first.

        The permit's member is ``<token>:<fence>:<limit>:<since_ms>:<holder>``;
        the acquire sends it with no fencing token (0), which the script
        writes in when it takes one (``fencing=True``; else its first use
        does). Its cancel is the attempt undone: leaving the queue when the
        wait ends without the permit, and giving back a permit granted to an
        attempt whose caller never learned of it (interrupted, cancelled, its
        reply lost); a Semaphore's limit lets the script pass on a wake-up
        for a free permit that this waiter will not come for."""
        resolved = self._resolve()
        may_wait, budget = self._wait_budget(blocking, blocking_timeout, resolved.settings)
        holder, limit = holder_description(), self._member_limit()
        tail = f"{limit}:{int(time.time() * 1000)}:{holder}"  # since: for display only
        begun = time.monotonic()
        token = self.token_mode + new_token()
        wait_ms = int(resolved.chunk * 1000) + WAITER_GRACE_MS
        script = self.acquire_script
        args = script.args_of(
            member=f"{token}:0:{tail}",
            lease_ms=resolved.lease_ms,
            wait_ms=wait_ms if may_wait else -wait_ms,  # negative: never queue
            fenced=1 if self._fencing else 0,
        )
        cancel_args = PERMIT_CANCEL.args_of(token=token, limit=limit)
        cancel = Call(PERMIT_CANCEL, resolved.keys_for(PERMIT_CANCEL), cancel_args)
        if resolved.auto_renew:  # no thread, no grant (watchdog.ensure_running)
            watchdog.ensure_running()
        outcome = yield from protocol.acquire(
            protocol.Attempt(
                name=self.name,
                call=Call(script, resolved.keys_for(script), args),
                parse=permit_reply,
                leave=cancel,
                undo=cancel,
                signal_key=resolved.sigprefix + token,
                chunk=resolved.chunk,
                may_wait=may_wait,
                deadline=None if budget is None else begun + budget,
            )
        )
        if outcome.status != HELD:
            if outcome.status != REFUSED:
                self._on_status(outcome.status, outcome.value)
            refused = AcquireResult.refused(outcome.value, outcome.refusal)
            counters.contended(self.name, time.monotonic() - begun)
            signals.announce_contended(self, begun, may_wait, refused.holder, refused.held_for)
            return refused
        # only time spent in line is a wait (see ``Lock``)
        waited = outcome.started - begun if outcome.waited else 0.0
        self._held(resolved, f"{token}:{outcome.value}:{tail}", holder, outcome, waited)
        return HELD_RESULT

    def _held(
        self, resolved: Resolved, member: str, holder: str, outcome: Outcome, waited: float
    ) -> None:
        """Bookkeeping of a new permit: the holder's stack, the watchdog, the
        tally, ``lock_acquired``."""
        holding = Holding(
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=member,  # what identifies the permit in the holder ZSET
            holder=holder,
            client=resolved.client,
            lease=resolved.lease,
            started=outcome.started,
            fencing_token=outcome.value,  # 0: taken on first use (_fence_steps)
            renew_script=PERMIT_EXTEND,
            renew_keys=resolved.keys_for(PERMIT_EXTEND),
            keys=resolved.keys_for(self.release_script),
            sigprefix=resolved.sigprefix,
        )
        holding.release_args = self.release_script.args_of(member=member)
        self._stack().append(holding)
        if self._loss is not None or resolved.max_hold is not None:
            told.attach_hooks(self, holding, resolved)
        if resolved.auto_renew:
            watchdog.watch(holding)
        counters.acquired(None, None, 0, self.name, waited)  # no counters but the history's
        signals.announce_acquired(self, waited, outcome.value or None)

    @staticmethod
    def _release_call(holding: Holding) -> tuple[Sequence[str | bytes], list[Any]]:
        """Keys and arguments of the release script, under the prefix the permit was taken."""
        return holding.keys, holding.release_args

    def _after_release(self, holding: Holding, result: int) -> None:
        if not result:
            holding.mark_lost("the lease was gone when the holder released it")
        lost = holding.lost
        holding.end()
        if lost is not None:
            raise self._lost(holding)
        signals.announce_released(self, holding.acquired_at)

    def _describe_keys(self) -> tuple[Any, list[str]]:
        settings = self._settings()
        keys, _ = self._key_set(self._prefix(settings))
        return self._client(settings), PERMIT_DESCRIBE.keys_of(
            dict(zip(self.roles, keys, strict=True))
        )

    def _owns(self, holders: list[HolderInfo]) -> bool:
        stack = self._stack()
        if not stack:
            return False
        token = stack[-1].token.split(":", 1)[0]
        return any(info.token == token for info in holders)
