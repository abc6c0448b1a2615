"""What every primitive with several holders shares: permits.

A permit is one holder's claim on a ``Semaphore`` or a ``ReadWriteLock``
side: its own token, lease and fencing token, a member of the primitive's
holder ZSET (see ``backend/scripts/_permits.lua``). The sync and async APIs share
everything but the I/O: the acquire is ``PermitBase._acquire_steps``, run by
the drivers (``engine/steps.py``, ``engine/drivers.py``). Each acquire takes a permit of
its own, as ``threading.Semaphore`` does; a permit belongs to the handle (in
its thread or task) that took it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import (
    PERMIT_CANCEL,
    PERMIT_DESCRIBE,
    PERMIT_EXTEND,
    PERMIT_RELEASE,
    Script,
)
from django_redislock.backend.values import HolderInfo, parse_holders
from django_redislock.engine import drivers
from django_redislock.engine import steps as protocol
from django_redislock.engine.drivers import AsyncConnection
from django_redislock.engine.steps import (
    HELD,
    HELD_RESULT,
    REFUSED,
    AcquireResult,
    Call,
    Step,
    permit_reply,
)
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding, current_pid, holder_description, new_token
from django_redislock.holds.registry import forget_when_done
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives.base import (
    WAITER_GRACE_MS,
    AsyncPrimitive,
    Primitive,
    Resolved,
)
from django_redislock.primitives.guarded import Guarded


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

    def call(self, script: Script) -> Call:
        """The acquire: who (``<token>:<tail>``, the member without its fence),
        lease_ms, wait_ms."""
        plan = self.plan
        who = f"{self.token}:{self.tail}"
        args = script.args_of(who=who, lease_ms=plan.lease_ms, wait_ms=plan.wait_ms)
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
    the bare fence) or ``{0, retry hint}`` (or a subclass-specific status, see
    ``permit_reply``), the release script ``1`` (released) or ``0`` (the lease
    was already gone). The sync and async APIs share everything but the I/O.
    """

    roles = ("holders", "fence", "queue", "deadlines")
    acquire_script: Script
    release_script: Script = PERMIT_RELEASE
    #: First character of every token, when the scripts need to see the mode.
    token_mode = ""

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

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of this holder's latest permit (``None`` when none)."""
        latest = self._latest()
        return latest.fencing_token if latest else None

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
            fencing_token=value,
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
        signals.announce_acquired(self, started - attempt.begun if waited else 0.0, value)
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


class PermitPrimitive(PermitBase, Guarded):
    """The synchronous API of a permit primitive; a holder is the object in one thread."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._local = threading.local()

    def _stack(self) -> list[Holding]:
        stack: list[Holding] | None = getattr(self._local, "stack", None)
        if stack is None or (stack and stack[0].pid != current_pid()):
            stack = self._local.stack = []  # new thread, or inherited through fork()
        return stack

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take a permit; ``False`` when none could be had in time.

        Raises ``LockBackendError`` when Redis cannot be reached.
        """
        return self._acquire(blocking, blocking_timeout).held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> AcquireResult:
        begun = time.monotonic()
        try:
            return drivers.run(
                self._acquire_steps(blocking, blocking_timeout), self._resolve().client
            )
        except LockBackendError as exc:
            signals.announce_failed(self, begun, exc)
            raise

    def release(self) -> None:
        """Return this holder's latest permit.

        Raises ``LockNotOwnedError`` when this holder holds none, and
        ``LockLostError`` when its lease ended (or was cleared) before the
        release, also when Redis cannot be reached to release it and the
        lease had ended by this holder's clock before the release was sent
        (``LockBackendError`` chained; see ``Lock.release``).
        """
        stack = self._stack()
        if not stack:
            raise self._not_owned()
        holding = stack.pop()
        holding.releasing = True
        keys, args = self._release_call(holding)
        sent = time.monotonic()
        try:
            result = self.release_script(holding.client, keys, args)
        except backend.BACKEND_ERRORS as exc:
            error = self._unreachable(holding, exc, sent, "released it")
            holding.end()  # the lease frees the permit if Redis was not told
            raise error from error.__cause__
        except BaseException:
            holding.end()
            raise
        self._after_release(holding, result)

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease of this holder's latest permit from now on
        (for the watchdog's renewals too; see ``Lock.extend``)."""
        holding = self._latest()
        drivers.run(self._extend_steps(holding, seconds), holding.client if holding else None)

    def owned(self) -> bool:
        """Whether this holder's latest permit is live, according to Redis."""
        return bool(self._stack()) and self._owns(self.holders())

    def holders(self) -> list[HolderInfo]:
        """Every live holder: token, ``host:pid:thread``, seconds of lease left, fence."""
        client, keys = self._describe_keys()
        with backend.translate_errors(self.name):
            reply = PERMIT_DESCRIBE(client, keys, PERMIT_DESCRIBE.args_of())
        return parse_holders(reply, mode_from_token=bool(self.token_mode))


class AsyncPermitPrimitive(PermitBase, AsyncPrimitive):
    """The asyncio API of a permit primitive; a holder is the object in one task.

    Round trips go through ``AsyncLock``'s connection mirror, so a waiting
    coroutine blocks no thread; the watchdog renews the permits.
    """

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._stacks: weakref.WeakKeyDictionary[asyncio.Task[Any], list[Holding]] = (
            weakref.WeakKeyDictionary()
        )

    def _stack(self) -> list[Holding]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"{type(self).__name__} must be used from inside an asyncio task.")
        stack = self._stacks.get(task)
        if stack is None or (stack and stack[0].pid != current_pid()):
            if stack is None:
                forget_when_done(type(self).__name__, self._stacks)
            stack = self._stacks[task] = []
        return stack

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take a permit; ``False`` when none could be had in time."""
        return (await self._acquire(blocking, blocking_timeout)).held

    async def _acquire(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> AcquireResult:
        begun = time.monotonic()
        try:
            conn = AsyncConnection(self._resolve().client)
            return await drivers.run_async(self._acquire_steps(blocking, blocking_timeout), conn)
        except LockBackendError as exc:
            signals.announce_failed(self, begun, exc)
            raise

    async def release(self) -> None:
        """Return this holder's latest permit (see ``Semaphore.release``)."""

        stack = self._stack()
        if not stack:
            raise self._not_owned()
        holding = stack.pop()
        holding.releasing = True
        keys, args = self._release_call(holding)
        sent = time.monotonic()
        try:
            with backend.translate_errors(self.name):
                conn = AsyncConnection(holding.client)
                result = await conn.run_to_the_end(self.release_script, keys, args)
        except LockBackendError as exc:
            error = self._unreachable(holding, exc, sent, "released it")
            holding.end()
            raise error from error.__cause__
        except BaseException:
            holding.end()
            raise
        self._after_release(holding, result)

    async def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease of this holder's latest permit from now on
        (for the watchdog's renewals too; see ``Lock.extend``)."""
        holding = self._latest()
        conn = AsyncConnection(holding.client if holding else None)
        await drivers.run_async(self._extend_steps(holding, seconds), conn)

    async def owned(self) -> bool:
        """Whether this holder's latest permit is live, according to Redis."""
        return bool(self._stack()) and self._owns(await self.holders())

    async def holders(self) -> list[HolderInfo]:
        """Every live holder (see ``Semaphore.holders``)."""

        client, keys = self._describe_keys()
        with backend.translate_errors(self.name):
            reply = await AsyncConnection(client).run(
                PERMIT_DESCRIBE, keys, PERMIT_DESCRIBE.args_of()
            )
        return parse_holders(reply, mode_from_token=bool(self.token_mode))
