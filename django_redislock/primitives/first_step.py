"""``First``: a ``Lock``'s or ``AsyncLock``'s acquire as far as its first
step, built by ``LockBase._first_attempt`` (``primitives/lock_common.py``).
Its driver sends the step with ``drivers.perform`` as a plain call, not from
a generator; only an outcome other than "taken" continues in the protocol
(``LockBase._after_first``), from this state. trio writes ``acquire()`` the
same way: ``acquire_nowait()``, then a park only on ``WouldBlock``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from django_redislock.engine.steps import Call
from django_redislock.holds.holding import Holding, holder_description, new_token

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script
    from django_redislock.holds.registry import Registry
    from django_redislock.primitives.base import Resolved


class First:
    """An acquire as far as its first step (``LockBase._first_attempt``):
    the plain ``SET`` to send (``take``; ``None`` for a re-entry, ``nest``, or
    a handle that asks for its fencing token up front), and what the rest of
    the acquire needs when that does not take the lock (``_after_first``)."""

    __slots__ = (
        "begun",
        "deadline",
        "holder",
        "may_wait",
        "nest",
        "registry",
        "resolved",
        "since_ms",
        "take",
        "token",
    )

    def __init__(
        self,
        resolved: Resolved,
        registry: Registry[Holding],
        may_wait: bool,
        begun: float,
        deadline: float | None,
    ) -> None:
        self.resolved = resolved
        self.registry = registry
        self.may_wait = may_wait
        self.begun = begun
        self.deadline = deadline
        self.nest: Holding | None = None
        self.take: Call | None = None
        self.token = self.holder = ""
        self.since_ms = 0

    def fresh(self, take: Script | None) -> None:
        """A new token and holder description; with ``take`` (``LOCK_TAKE``),
        the plain ``SET NX PX`` of the value an unfenced grant holds."""
        self.token = token = new_token()
        self.holder = holder = holder_description(self.registry.pid)
        self.since_ms = since_ms = int(time.time() * 1000)
        if take is not None:
            lease_ms = self.resolved.lease_ms
            value = f"{token}:0:1:0:{lease_ms}:{since_ms}:{holder}"
            keys = self.resolved.release_keys
            self.take = Call(take, keys, (value, lease_ms), deadline=self.deadline)
        else:
            self.take = None
