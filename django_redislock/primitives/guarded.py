"""What every primitive has, and its ``with`` blocks, written once.

``Lock``, ``Semaphore``, ``ReadWriteLock``'s sides, ``MultiLock`` and ``Redlock``
are all built with the same waiting and lease options, fixed when built, and
word their errors alike ("Could not acquire lock 'x' in time.", "... is not held
by this holder.", "... was lost: ..."): that is ``Worded``, the one class every
primitive derives from. They leave a ``with`` block alike too: the release's
``LockLostError`` is raised, unless another exception is already on its way,
which then carries it as a note instead of being replaced by it. The blocks are
plain functions of the primitive (``enter``, ``leave``, and ``aenter``,
``aleave`` for ``async with``), which each class's ``__enter__`` and
``__exit__`` (``__aenter__``, ``__aexit__``) call: a class has the blocks it
names, and no base class more for them.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django_redislock.backend.values import holder_phrase
from django_redislock.exceptions import LockLostError, LockNotOwnedError, LockTimeout
from django_redislock.validation import fixed

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from django_redislock.engine.steps import AcquireResult
    from django_redislock.holds.holding import Holding
    from django_redislock.holds.losses import LossHooks, LossOptions


def timeout_error(subject: str, result: AcquireResult, name: str | None) -> LockTimeout:
    """The ``LockTimeout`` of a refused ``result``: ``subject``, then who held
    the name and for how long when the refusal said so."""
    holder = result.holder
    if holder is not None:
        subject = f"{subject}: held by {holder_phrase(holder, result.held_for)}"
    return LockTimeout(
        f"{subject}.",
        name=name,
        retry_after=result.retry_after,
        holder=holder,
        held_for=result.held_for,
    )


class Worded:
    """Every primitive, sync or asyncio: the waiting and lease options it was
    built with (``validation.checked_options``; fixed, ``validation.fixed``),
    and its errors, worded the same for all."""

    name: str
    kind = "primitive"
    #: What its error messages call it, when not its ``kind``.
    noun = ""

    timeout: float | None = fixed("timeout")
    blocking: bool = fixed("blocking")
    blocking_timeout: float | None = fixed("blocking_timeout")
    auto_renew: bool | None = fixed("auto_renew")

    def _noun(self) -> str:
        return self.noun or self.kind

    def _timeout_error(self, result: AcquireResult) -> LockTimeout:
        subject = f"Could not acquire {self._noun()} {self.name!r} in time"
        return timeout_error(subject, result, self.name)

    def _not_owned(self) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"{self._noun().capitalize()} {self.name!r} is not held by this holder.",
            name=self.name,
        )

    def _lost(self, holding: Holding) -> LockLostError:
        reason = holding.lost or "the lease expired or was cleared before release"
        return LockLostError(
            f"{self._noun().capitalize()} {self.name!r} was lost: {reason}.", name=self.name
        )

    @staticmethod
    def _exit_error(
        error: BaseException, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None:
        """Raise ``error`` from ``__exit__`` unless another exception is already on its way."""
        if exc is None:
            raise error
        if sys.version_info >= (3, 11):
            exc.add_note(f"django-redislock: {error}")


# --- with primitive: -------------------------------------------------------------------


class _Guarded(Protocol):
    """A synchronous primitive, as its ``with`` block uses it."""

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> Any: ...
    def release(self) -> Any: ...
    def _timeout_error(self, result: AcquireResult) -> LockTimeout: ...
    def _exit_error(
        self, error: BaseException, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None: ...


_G = TypeVar("_G", bound=_Guarded)


def enter(primitive: _G) -> _G:
    """``__enter__`` of every synchronous primitive: acquire, or raise ``LockTimeout``."""
    result = primitive._acquire(None, None)
    if not result.held:
        raise primitive._timeout_error(result)
    return primitive


def leave(
    primitive: _Guarded, exc_type: type[BaseException] | None, exc: BaseException | None
) -> None:
    """``__exit__`` of every synchronous primitive: release, and raise
    ``LockLostError`` if the lease was lost (see the module's docstring)."""
    try:
        primitive.release()
    except LockLostError as error:
        primitive._exit_error(error, exc_type, exc)


# --- async with primitive: -------------------------------------------------------------


class _AsyncGuarded(Protocol):
    """An asyncio primitive, as its ``async with`` block uses it."""

    _loss: LossOptions | None

    def _acquire(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> Awaitable[AcquireResult]: ...
    def release(self) -> Awaitable[None]: ...
    def _hold_now(self) -> Holding | None: ...
    def _timeout_error(self, result: AcquireResult) -> LockTimeout: ...
    def _lost(self, holding: Holding) -> LockLostError: ...
    def _exit_error(
        self, error: BaseException, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None: ...


_A = TypeVar("_A", bound=_AsyncGuarded)


async def aenter(primitive: _A) -> _A:
    """``__aenter__`` of every asyncio primitive, as ``enter``."""
    result = await primitive._acquire(None, None)
    if not result.held:
        raise primitive._timeout_error(result)
    return primitive


async def aleave(
    primitive: _AsyncGuarded, exc_type: type[BaseException] | None, exc: BaseException | None
) -> None:
    """``__aexit__`` of every asyncio primitive, meaning what ``leave`` means.

    With ``cancel_on_loss``, a loss cancels the holding task
    (``holds/losses.py``); leaving the block then raises ``LockLostError``,
    chained to that ``CancelledError``, instead of it. A cancellation from
    elsewhere still propagates as ``CancelledError``: the loss's own request
    is withdrawn (``Task.uncancel``) and any other still counts. Python 3.10
    does not count cancellation requests: there one arriving together with
    the loss's is taken for it.
    """
    holding = _leaving(primitive) if primitive._loss is not None else None
    hooks = holding.hooks if holding is not None else None
    try:
        await primitive.release()
    except LockLostError as error:
        if hooks is not None and hooks.cancelled and _withdrawn(hooks, exc):
            raise error from exc
        primitive._exit_error(error, exc_type, exc)
    except asyncio.CancelledError as cancelled:
        # the loss's cancel, delivered only once the block had ended
        if holding is None or hooks is None or not hooks.cancelled:
            raise
        if not _withdrawn(hooks, cancelled):
            raise
        raise primitive._lost(holding) from cancelled


def _leaving(primitive: _AsyncGuarded) -> Holding | None:
    """The hold this block leaves, its hooks marked left: a loss found
    from now on cancels the task no more (on its loop, as the cancel is)."""
    holding = primitive._hold_now()
    if holding is not None and holding.hooks is not None and holding.depth <= 1:
        holding.hooks.leaving = True
    return holding


def _withdrawn(hooks: LossHooks, exc: BaseException | None) -> bool:
    """Whether the block ended by the loss's own cancel (``cancel_on_loss``),
    now withdrawn: ``False`` when another cancellation is pending as well."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    if sys.version_info >= (3, 11) and hooks.task is not None:
        return hooks.task.uncancel() == 0
    return True
