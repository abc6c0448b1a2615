"""The quorum arithmetic of ``Redlock`` and its holding.

A Redlock is held while a majority of independent servers hold it, for the
lease less the clock-drift allowance of the algorithm (antirez, "Distributed
locks with Redis"); ``RedlockHolding`` renews it on every server at once
(``fanout``) and reports it lost when a majority answers that it is not.
"""

from __future__ import annotations

import time
from typing import Any

from . import fanout
from .exceptions import LockBackendError
from .holding import Holding
from .scripts import LOCK_EXTEND

#: Clock drift allowance of the Redlock algorithm: 1% of the lease plus 2 ms.
DRIFT_FACTOR = 0.01
DRIFT_FIXED = 0.002
#: Bounds of the random delay between two attempts of a waiting acquire.
RETRY_MIN = 0.005
RETRY_MAX = 0.1

_PARTS = ("redlock", "redlock-fence", "redlock-queue", "redlock-deadlines")


def drift(lease: float) -> float:
    """The clock-drift allowance for ``lease`` seconds."""
    return lease * DRIFT_FACTOR + DRIFT_FIXED


def reply_timeout(lease: float, allowance: float) -> float:
    """How long to wait for any one server: small beside the lease.

    The Redlock algorithm asks for a per-server timeout much shorter than the
    lease, so that one stalled server (a minority) cannot eat the validity the
    majority granted; 5% of the lease, at least 250 ms for a loaded machine.
    """
    return max(min(lease - allowance, max(0.25, lease * 0.05)), 0.001)


def quorum(count: int) -> int:
    return count // 2 + 1


class RedlockHolding(Holding):
    """A claim on a majority; renewing extends it on every server."""

    __slots__ = ("candidate_fence", "clients", "drift", "fence_key", "lock_key")

    def __init__(
        self, *, clients: list[Any], lock_key: str, fence_key: str, candidate_fence: int,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(renew_script=LOCK_EXTEND, client=None, fencing_token=None, **kwargs)
        self.clients = clients
        self.lock_key = lock_key
        self.fence_key = fence_key
        self.candidate_fence = candidate_fence
        self.drift = drift(self.lease)
        # The lease counts from before the first request, less the drift allowance.
        self.lease_deadline -= self.drift

    def extend_all(self, lease: float) -> bool:
        """Extend on every server; ``True`` when a majority did so in time.

        ``False`` when a majority answered that the lock is not ours (it is
        lost); ``LockBackendError`` when too few answered to tell.
        """
        started = time.monotonic()
        results = fanout.run_on_all(
            self.clients,
            LOCK_EXTEND,
            [self.lock_key],
            [self.token, int(lease * 1000)],
            timeout=reply_timeout(lease, drift(lease)),
        )
        extended = sum(1 for r in results if r == 1)
        refused = sum(1 for r in results if r == 0)
        needed = quorum(len(self.clients))
        if extended >= needed and time.monotonic() - started < lease - drift(lease):
            self.lease = lease
            self.lease_deadline = started + lease - drift(lease)
            return True
        if len(self.clients) - refused < needed:
            return False
        raise _too_few_error(self.name, results, "extend")

    def renew(self) -> bool:
        if not self.active:
            return True
        return self.extend_all(self.lease) or self.releasing


def _too_few_error(name: str, results: list[Any], action: str) -> LockBackendError:
    failures = [r for r in results if isinstance(r, BaseException)]
    answered = len(results) - len(failures)
    error = LockBackendError(
        f"Redlock {name!r}: only {answered} of {len(results)} Redis servers answered the "
        f"{action}; a majority ({quorum(len(results))}) is needed. First failure: "
        f"{type(failures[0]).__name__}: {failures[0]}"
        if failures
        else f"Redlock {name!r}: no majority could {action} it.",
        name=name,
    )
    if failures:
        error.__cause__ = failures[0]
    return error
