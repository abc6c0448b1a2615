"""How every primitive says what went wrong, and its ``with`` block, written once.

``Lock``, ``Semaphore``, ``ReadWriteLock``'s sides, ``MultiLock`` and ``Redlock``
word their errors alike ("Could not acquire lock 'x' in time.", "... is not held
by this holder.", "... was lost: ...") and leave a ``with`` block alike: the
release's ``LockLostError`` is raised, unless another exception is already on its
way, which then carries it as a note instead of being replaced by it.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from django_redislock.exceptions import LockLostError, LockNotOwnedError, LockTimeout

if TYPE_CHECKING:
    from django_redislock.engine.steps import AcquireResult
    from django_redislock.holds.holding import Holding

_G = TypeVar("_G", bound="Guarded")


class Worded:
    """Errors worded the same for every primitive, sync or asyncio."""

    name: str
    kind = "primitive"
    #: What its error messages call it, when not its ``kind``.
    noun = ""

    def _noun(self) -> str:
        return self.noun or self.kind

    def _timeout_error(self, result: AcquireResult) -> LockTimeout:
        return LockTimeout(
            f"Could not acquire {self._noun()} {self.name!r} in time.",
            name=self.name,
            retry_after=result.retry_after,
        )

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


class Guarded(Worded):
    """``with primitive:`` for every synchronous primitive.

    Entering acquires or raises ``LockTimeout``; leaving releases, and raises
    ``LockLostError`` if the lease was lost (see the module's docstring).
    """

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> Any:
        """Acquire: an ``AcquireResult``, held or refused with the server's retry hint."""
        raise NotImplementedError

    def release(self) -> Any:
        raise NotImplementedError

    def __enter__(self: _G) -> _G:
        result = self._acquire(None, None)
        if not result.held:
            raise self._timeout_error(result)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLostError as error:
            self._exit_error(error, exc_type, exc)
