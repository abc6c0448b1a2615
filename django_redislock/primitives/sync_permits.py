"""``PermitPrimitive``: the synchronous API of a permit primitive (``Semaphore``,
``ReadLock``, ``WriteLock``); ``PermitBase`` (``permits.py``) holds everything
but the I/O.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, TypeVar

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import PERMIT_DESCRIBE
from django_redislock.backend.values import HolderInfo, parse_holders
from django_redislock.engine import drivers, pool
from django_redislock.engine.steps import AcquireResult
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.primitives import guarded
from django_redislock.primitives.base import token_of
from django_redislock.primitives.permits import PermitBase

_P = TypeVar("_P", bound="PermitPrimitive")


class PermitPrimitive(PermitBase):
    """The synchronous API of a permit primitive; a holder is the object in one thread."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._local = threading.local()

    def _stack(self) -> list[Holding]:
        stack: list[Holding] | None = getattr(self._local, "stack", None)
        if stack is None or (stack and stack[0].pid != current_pid()):
            stack = self._local.stack = []  # new thread, or inherited through fork()
        return stack

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of this holder's latest permit (``None`` when none).

        Larger than every token given out earlier for the name. Taken on
        first use, by one owner-checked round trip, unless the handle was
        built with ``fencing=True`` (then the acquire took it); read again,
        the same token, with no round trip. Raises ``LockLostError`` when the
        permit is found gone: a lost permit gets no token.
        """
        return token_of(self._latest(), self._fence_steps)

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
            result = pool.send(self.release_script, holding.client, keys, args)
        except BaseException as error:
            self._released(holding, sent, error=error)
        else:
            self._released(holding, sent, result)

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease of this holder's latest permit from now on
        (for the watchdog's renewals too; see ``Lock.extend``)."""
        holding = self._latest()
        drivers.run(self._extend_steps(holding, seconds), holding.client if holding else None)

    def owned(self) -> bool:
        """Whether this holder's latest permit is live, according to Redis."""
        return bool(self._stack()) and self._owns(self.holders())

    def __enter__(self: _P) -> _P:
        return guarded.enter(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        guarded.leave(self, exc_type, exc)

    def holders(self) -> list[HolderInfo]:
        """Every live holder: token, ``host:pid:thread``, seconds of lease left, fence."""
        client, keys = self._describe_keys()
        with backend.translate_errors(self.name):
            reply = PERMIT_DESCRIBE(client, keys, PERMIT_DESCRIBE.args_of())
        return parse_holders(reply, mode_from_token=bool(self.token_mode))
