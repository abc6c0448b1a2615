"""A decorated callable run under a lock or a permit: ``@require_lock`` and ``@require_slot``.

``decorators.py`` checks the decorators' arguments and says what they
promise; this runs each call: names the lock from the call (``decorators.NamePlan``),
takes it, answers contention, a Redis outage or a lost lease (``responses``),
runs the callable and leaves, sync or async. ``Guard`` holds a ``Lock``
(handed to the open transaction, ``transactions.hand_over``), ``SlotGuard``
a ``Semaphore`` permit (released when the call ends).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import BadRequest, ImproperlyConfigured
from django.db import connections, transaction
from django.http import HttpResponseBase

from django_redislock import responses
from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.context import describing_request
from django_redislock.exceptions import LockBackendError, LockLostError
from django_redislock.holds import counters
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.lock import Lock
from django_redislock.primitives.semaphore import AsyncSemaphore, Semaphore
from django_redislock.transactions import hand_over

if TYPE_CHECKING:  # built by the decorators, which import this module
    from django_redislock.decorators import NamePlan

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: Lock failures raised under a view call that it answers instead of a 500.
_ANSWERED = (LockBackendError, LockLostError)


def _release_failed(name: str, exc: LockBackendError, request: Any) -> None:
    """Redis failed while releasing after the function ran: its lease frees the
    lock (the watchdog stopped renewing it). Logged, not raised into a view's
    answer: a 500 (or a 503) would invite a retry of work that is done. Part
    of an outage: logged once, then summarised (``outages.OutageLog``)."""
    where = responses.where_called(request)
    responses.outage_log().failure(
        exc,
        f"{where} (release)",
        "Could not release %r after the call under %s; its lease will free it: %s",
        name,
        where,
        exc,
    )


def _roll_back() -> bool:
    """Mark the transactions a view call ran in for rollback, as its exception
    would have done had it reached them: their ``atomic()`` rolls back instead
    of committing a response that says the work failed. Whether there was one.
    (A connection in autocommit-off mode outside ``atomic()`` is its owner's
    to roll back; async views run in none.)"""
    marked = False
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            transaction.set_rollback(True, using=connection.alias)
            marked = True
    return marked


def _release_or_hold_until_commit(lock: Lock) -> None:
    """Release now, or when the enclosing database transaction ends.

    Under ``ATOMIC_REQUESTS`` (or any outer ``atomic()``) the function's writes
    commit after it returns. Releasing at the return would let the next holder
    read the row before those writes are visible and overwrite them: the lost
    update the lock is there to prevent. So the thread's outermost hold is
    handed to the transaction, which releases it after its commit or rollback.
    """
    if not hand_over(lock):
        lock.__exit__(None, None, None)


def wrap(func: F, guard: Guard) -> F:
    """``func`` run through ``guard``, sync or async as ``func`` is."""
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        qualname = getattr(func, "__qualname__", repr(func))
        raise TypeError(
            f"{guard.decorator} cannot guard {qualname}(), a generator function: its "
            f"body runs after the call has returned, and the {guard.noun} was released "
            f"by then. Take it inside: `with {guard.primitive}(...):` "
            f"(`async with Async{guard.primitive}(...):`)."
        )
    if iscoroutinefunction(func):

        async def _async_view(*args: Any, **kwargs: Any) -> Any:
            return await guard.call_async(*args, **kwargs)

        return cast(F, markcoroutinefunction(functools.wraps(func)(_async_view)))

    def _view(*args: Any, **kwargs: Any) -> Any:
        return guard.call(*args, **kwargs)

    return cast(F, functools.wraps(func)(_view))


class Guard:
    """One decorated callable: names its lock per call, takes it, answers
    contention and backend errors, runs the callable and releases. The sync
    and async calls are twins that share everything but the awaits.
    ``require_slot``'s ``SlotGuard`` takes a semaphore's permit instead."""

    decorator, noun, primitive = "require_lock", "lock", "Lock"

    def __init__(
        self,
        func: Callable[..., Any],
        template: str,
        plan: NamePlan,
        answers: responses.Answers,
        options: tuple[float | None, float | None],
    ) -> None:
        self.func = func
        self.template = template
        self.plan = plan
        self.answers = answers
        self.timeout, self.blocking_timeout = options
        self.contended = functools.partial(
            answers.contended, asynchronous=iscoroutinefunction(func)
        )

    def options(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "blocking_timeout": self.blocking_timeout,
            "using": self.answers.using,
        }

    def make(self, name: str) -> Any:
        # the holder is the thread: a nested call for the same name re-enters
        return Lock(name, **self.options())

    def make_async(self, name: str) -> Any:
        # the holder is the task: a nested call for the same name re-enters
        return AsyncLock(name, **self.options())

    def leave(self, lock: Any) -> None:
        """Leave after the function returned."""
        _release_or_hold_until_commit(lock)

    async def leave_async(self, lock: Any) -> None:
        """Leave after the async function returned (no transaction to hand to)."""
        await lock.__aexit__(None, None, None)

    def leave_raising(self, lock: Any, exc: BaseException) -> None:
        """Leave after the function raised ``exc``."""
        # in a transaction its writes may still commit (a caller that
        # catches the error): held until it ends, as after a return
        if not hand_over(lock, confirm=False):
            lock.__exit__(type(exc), exc, exc.__traceback__)

    def lock_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        request = self.plan.request_of(args)
        try:
            return self.plan.name(request, args, kwargs), request
        except ValueError as exc:
            if request is None:
                raise
            raise BadRequest(f"Cannot lock {self.template!r}: {exc}") from exc

    def made(self, name: str, request: Any, asynchronous: bool = False) -> Any:
        """The call's lock (or permit), or, for a view call whose ``using`` is
        not in ``CACHES``, the 503 that answers it. The alias is checked when
        the decorator is applied; only one applied before Django's settings
        were configured meets it here, at the call."""
        try:
            return self.make_async(name) if asynchronous else self.make(name)
        except ImproperlyConfigured as exc:
            if request is None:
                raise
            return self.answers.misconfigured(request, exc)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        name, request = self.lock_name(args, kwargs)
        lock = self.made(name, request)
        if isinstance(lock, HttpResponseBase):
            return lock
        try:
            with describing_request(request):
                acquired = lock._acquire(None, None)
        except LockBackendError as exc:
            return self.answers.unavailable(request, exc)
        responses.outage_log().answered()
        if not acquired.held:
            return self.contended(request, lock._timeout_error(acquired))
        try:
            result = self.func(*args, **kwargs)
        except _ANSWERED as exc:
            if request is None or self.answers.raises(exc):
                self._leave_raised(lock, name, exc, request)
                raise
            try:  # answered (and logged) first: a release failing too is the same outage
                return self.answers.failed(request, exc, rolled_back=_roll_back())
            finally:
                self._leave_raised(lock, name, exc, request)
        except BaseException as exc:
            self._leave_raised(lock, name, exc, request)
            raise
        try:
            self.leave(lock)
        except LockLostError as exc:
            if request is None or self.answers.raises(exc):
                raise
            return self.answers.lost(request, exc, rolled_back=_roll_back())
        except LockBackendError as exc:
            if request is None:
                raise
            _release_failed(name, exc, request)  # the view's work is done: answer it
        return result

    def _leave_raised(self, lock: Any, name: str, exc: BaseException, request: Any) -> None:
        """Leave the lock after the function raised ``exc``, which goes on."""
        try:
            self.leave_raising(lock, exc)
        except LockBackendError as release_exc:
            _release_failed(name, release_exc, request)  # the original error goes on

    async def call_async(self, *args: Any, **kwargs: Any) -> Any:
        name, request = self.lock_name(args, kwargs)
        lock = self.made(name, request, asynchronous=True)
        if isinstance(lock, HttpResponseBase):
            return lock
        try:
            with describing_request(request):
                acquired = await lock._acquire(None, None)
        except LockBackendError as exc:
            return await _answered(self.answers.unavailable(request, exc))
        responses.outage_log().answered()
        if not acquired.held:
            return await _answered(self.contended(request, lock._timeout_error(acquired)))
        try:
            result = await self.func(*args, **kwargs)
        except _ANSWERED as exc:
            if request is None or self.answers.raises(exc):
                await self._leave_raised_async(lock, name, exc, request)
                raise
            try:  # an async view runs in no transaction of its thread's: none to roll back
                return await _answered(self.answers.failed(request, exc, rolled_back=False))
            finally:
                await self._leave_raised_async(lock, name, exc, request)
        except BaseException as exc:
            await self._leave_raised_async(lock, name, exc, request)
            raise
        try:
            await self.leave_async(lock)
        except LockLostError as exc:
            if request is None or self.answers.raises(exc):
                raise
            return await _answered(self.answers.lost(request, exc, rolled_back=False))
        except LockBackendError as exc:
            if request is None:
                raise
            _release_failed(name, exc, request)  # the view's work is done: answer it
        return result

    async def _leave_raised_async(
        self, lock: Any, name: str, exc: BaseException, request: Any
    ) -> None:
        try:
            await lock.__aexit__(type(exc), exc, exc.__traceback__)
        except LockBackendError as release_exc:
            _release_failed(name, release_exc, request)  # the original error goes on


class SlotGuard(Guard):
    """``require_slot``: a permit of the key's ``Semaphore`` instead of a lock,
    released when the function ends (see ``require_slot``)."""

    decorator, noun, primitive = "require_slot", "slot", "Semaphore"

    def __init__(self, limit: int, *args: Any) -> None:
        super().__init__(*args)
        self.limit = limit

    def make(self, name: str) -> Any:
        # each call takes a permit of its own, nested calls too
        return Semaphore(name, self.limit, **self.options())

    def make_async(self, name: str) -> Any:
        return AsyncSemaphore(name, self.limit, **self.options())

    def leave(self, lock: Any) -> None:
        _count_hold(lock)
        try:
            lock.__exit__(None, None, None)
        except LockLostError as exc:
            _slot_lost(exc)

    async def leave_async(self, lock: Any) -> None:
        _count_hold(lock)
        try:
            await lock.__aexit__(None, None, None)
        except LockLostError as exc:
            _slot_lost(exc)

    def leave_raising(self, lock: Any, exc: BaseException) -> None:
        _count_hold(lock)
        lock.__exit__(type(exc), exc, exc.__traceback__)


def _count_hold(permit: Any) -> None:
    """Count how long the call held its slot, for the 429's ``Retry-After``
    (``holds.estimates.slot_retry_after``): what a slot's holders take, not the
    lease. One tally increment; written in the counters' next batch."""
    holding = permit._latest()
    settings = get_settings()
    if holding is None or not settings.stats_ttl_ms:
        return
    alias = permit.using or settings.cache
    key = backend.key(backend.namespace(alias, settings.key_prefix), permit.name, "stats")
    seconds = time.monotonic() - holding.acquired_at
    client = backend.get_client(alias)
    counters.held(client, key.encode(), settings.stats_ttl_ms, permit.name, seconds)


def _slot_lost(error: LockLostError) -> None:
    """A slot's permit was lost while the call ran (cleared, expired, lost
    with Redis): logged, not raised. A slot limits load and guards no data,
    so the finished work stands (a lock's loss rolls it back); for a while
    the key may have had one call more than its limit."""
    logger.warning("%s; the call under it had finished, its result stands.", error)


async def _answered(answer: Any) -> Any:
    """A response, or what an async handler's coroutine returns."""
    return await answer if inspect.isawaitable(answer) else answer
