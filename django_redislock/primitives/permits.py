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
from collections.abc import Generator, Sequence
from dataclasses import dataclass
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
    Step,
    permit_reply,
)
from django_redislock.holds.holding import Holding, holder_description, new_token
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives.base import (
    WAITER_GRACE_MS,
    Primitive,
    Resolved,
)
from django_redislock.validation import check_bool


@dataclass(slots=True)
class _Plan:
    """What every acquire of one mode by one holder description shares."""

    lease_ms: int
    #: How long a queued waiter stays presumed alive; negative: never queue.
    wait_ms: int
    holder: str
    #: What the holder's member says the limit is (``_member_limit``).
    limit: int


@dataclass(slots=True)
class _Attempt:
    """One acquire: its plan and what is its own (token, member tail)."""

    resolved: Resolved
    plan: _Plan
    may_wait: bool
    deadline: float | None
    begun: float
    token: str
    #: ``<limit>:<since_ms>:<holder>``, the holder's member after ``<token>:<fence>:``.
    tail: str
    #: Whether the acquire takes the fencing token (else its first use does).
    fenced: bool

    def call(self, script: Script) -> Call:
        """The acquire: the member with no fencing token (``<token>:0:<tail>``),
        lease_ms, wait_ms, and whether to take the token now."""
        plan = self.plan
        args = script.args_of(
            member=f"{self.token}:0:{self.tail}",
            lease_ms=plan.lease_ms,
            wait_ms=plan.wait_ms,
            fenced=1 if self.fenced else 0,
        )
        return Call(script, self.resolved.keys_for(script), args)

    def cancel(self) -> Call:
        """The attempt undone: leaving the queue when the wait ends without the
        permit, and giving back a permit granted to an attempt whose caller
        never learned of it (interrupted, cancelled, its reply lost). A
        Semaphore's limit lets the script pass on a wake-up for a free permit
        that this waiter will not come for."""
        args = PERMIT_CANCEL.args_of(token=self.token, limit=self.plan.limit)
        return Call(PERMIT_CANCEL, self.resolved.keys_for(PERMIT_CANCEL), args)


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

    def __init__(self, name: str, *, fencing: bool = False, **options: Any) -> None:
        super().__init__(name, **options)
        self._fencing = bool(check_bool(fencing, "fencing", allow_none=False))

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

    def _begin(self, blocking: bool | None, blocking_timeout: float | None) -> _Attempt:
        resolved = self._resolve()
        may_wait, budget = self._wait_budget(blocking, blocking_timeout, resolved.settings)
        holder = holder_description()
        plan = self._plan(resolved, may_wait, holder)
        since = int(time.time() * 1000)  # for display only, never for ordering
        begun = time.monotonic()
        return _Attempt(
            resolved,
            plan,
            may_wait,
            None if budget is None else begun + budget,
            begun,
            self.token_mode + new_token(),
            f"{plan.limit}:{since}:{holder}",
            self._fencing,
        )

    def _plan(self, resolved: Resolved, may_wait: bool, holder: str) -> _Plan:
        wait_ms = int(resolved.chunk * 1000) + WAITER_GRACE_MS
        return _Plan(
            resolved.lease_ms, wait_ms if may_wait else -wait_ms, holder, self._member_limit()
        )

    def _acquire_steps(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> Generator[Step, Any, AcquireResult]:
        """Acquire (``protocol.acquire``): held, or refused with the retry hint."""
        attempt = self._begin(blocking, blocking_timeout)
        if attempt.resolved.auto_renew:  # no thread, no grant (watchdog.ensure_running)
            watchdog.ensure_running()
        cancel = attempt.cancel()
        outcome = yield from protocol.acquire(
            protocol.Attempt(
                name=self.name,
                call=attempt.call(self.acquire_script),
                parse=permit_reply,
                leave=cancel,
                undo=cancel,
                signal_key=attempt.resolved.sigprefix + attempt.token,
                chunk=attempt.resolved.chunk,
                may_wait=attempt.may_wait,
                deadline=attempt.deadline,
            )
        )
        return self._finish(
            attempt, outcome.status, outcome.value, outcome.started, waited=outcome.waited
        )

    def _finish(
        self, attempt: _Attempt, status: int, value: int, started: float, *, waited: bool
    ) -> AcquireResult:
        """Record the outcome: held, or refused with the retry hint."""
        if status != HELD:
            if status != REFUSED:
                self._on_status(status, value)
            signals.announce_contended(self, attempt.begun, attempt.may_wait)
            return AcquireResult.refused(value)
        plan, resolved = attempt.plan, attempt.resolved
        member = f"{attempt.token}:{value}:{attempt.tail}"
        holding = Holding(
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=member,  # what identifies the permit in the holder ZSET
            holder=plan.holder,
            client=resolved.client,
            lease=resolved.lease,
            started=started,
            fencing_token=value,  # 0: taken on first use (_fence_steps)
            renew_script=PERMIT_EXTEND,
            renew_keys=resolved.keys_for(PERMIT_EXTEND),
            keys=resolved.keys_for(self.release_script),
            sigprefix=resolved.sigprefix,
        )
        holding.release_args = self.release_script.args_of(member=member)
        self._stack().append(holding)
        if resolved.auto_renew:
            watchdog.watch(holding)
        # only time spent in line is a wait (see ``Lock``)
        signals.announce_acquired(self, started - attempt.begun if waited else 0.0, value or None)
        return HELD_RESULT

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
