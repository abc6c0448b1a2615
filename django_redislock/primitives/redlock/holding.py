"""A ``Redlock`` holder's claim on a majority, renewed on every server at once.

``RedlockHolding`` extends the lease on every server through ``fanout`` and
reports the lock lost when a majority answers that it is not ours; the lease
counts from before the first request, less the drift allowance (``quorum``).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

import django_redislock.primitives.redlock.fanout as fanout
from django_redislock.backend.scripts import LOCK_EXTEND, LOCK_RELEASE, REDLOCK_FENCE
from django_redislock.exceptions import LockBackendError
from django_redislock.holds.holding import Holding
from django_redislock.primitives.redlock.fanout import Servers
from django_redislock.primitives.redlock.quorum import drift, quorum, reply_timeout, too_few_error
from django_redislock.primitives.redlock.servers import lock_call

#: How long a release waits for any one server's answer.
RELEASE_TIMEOUT = 1.0


class RedlockHolding(Holding):
    """A claim on a majority; renewing extends it on every server."""

    __slots__ = ("candidate_fence", "drift", "redlock_keys", "servers")

    def __init__(
        self, *, servers: Servers, redlock_keys: list[str], candidate_fence: int, **kwargs: Any
    ) -> None:
        release = lock_call(LOCK_RELEASE, redlock_keys, kwargs["token"])
        super().__init__(
            renew_script=LOCK_EXTEND,
            renew_keys=list(lock_call(LOCK_EXTEND, redlock_keys, kwargs["token"]).keys),
            client=None,
            fencing_token=None,
            keys=list(release.keys),
            **kwargs,
        )
        self.servers = servers
        self.redlock_keys = redlock_keys
        self.candidate_fence = candidate_fence
        self.drift = drift(self.lease)
        # The lease counts from before the first request, less the drift allowance.
        self.lease_deadline -= self.drift

    @property
    def lane(self) -> Hashable:
        """One lane per set of servers: its renewals wait on them all at once."""
        return id(self.servers)

    @property
    def batch_client(self) -> None:
        """Renewed alone: its renewal waits on several servers at once."""
        return None

    @property
    def lock_key(self) -> str:
        return self.redlock_keys[0]

    @property
    def fence_key(self) -> str:
        return self.redlock_keys[1]

    def extend_all(self, lease: float) -> bool:
        """Extend on every server; ``True`` when a majority did so in time (the
        caller keeps the books: ``Holding.renew``, ``begin_extend``/``end_extend``).

        It returns once a majority has extended, without waiting out a server
        that hangs (its reply timeout, for each renewal of each hold on those
        servers, one after another in the watchdog's lane); the others are
        still sent the extend. ``False`` when a majority answered that the
        lock is not ours (it is lost); ``LockBackendError`` when too few
        answered to tell.
        """
        started = time.monotonic()
        call = lock_call(LOCK_EXTEND, self.redlock_keys, self.token, lease_ms=int(lease * 1000))
        timeout = reply_timeout(lease, drift(lease))
        servers = self.servers
        needed = quorum(len(servers))
        results = fanout.run_on_all(
            servers, call.script, call.keys, call.args, timeout=timeout, enough=needed
        )
        extended = sum(1 for r in results if r == 1)
        refused = sum(1 for r in results if r == 0)
        if extended >= needed and time.monotonic() - started < lease - drift(lease):
            return True
        if len(results) - refused < needed:
            return False
        raise too_few_error(self.name, results, "extend")

    def release_everywhere(self) -> LockBackendError | None:
        """Release on every server; the error to raise when too few answered
        (``None``: released on a majority). A majority that answered it is
        not ours marks it lost; so does a lease that had ended before the
        release was sent, when too few answered to tell."""
        call = lock_call(LOCK_RELEASE, self.redlock_keys, self.token)
        sent = time.monotonic()
        # every server's answer, each awaited RELEASE_TIMEOUT at most: a hung
        # one costs that, not the lease (or, with no socket timeout, its whole
        # length); one that does not answer in time frees its copy when the
        # lease ends
        results = fanout.run_on_all(
            self.servers, call.script, call.keys, call.args, timeout=RELEASE_TIMEOUT
        )
        released = sum(1 for r in results if r == 0)
        not_ours = sum(1 for r in results if r == -1)
        needed = quorum(len(results))
        if released < needed and len(results) - not_ours < needed:
            self.mark_lost("a majority no longer held it when it was released")
        if released >= needed:
            return None
        self.lapsed(sent, "released it")
        return too_few_error(self.name, results, "release")

    def record_fence(self) -> bool:
        """Record this hold's fencing token on every server that still has it
        (one round trip, see ``Redlock.fencing_token``); ``False``, marked
        lost, when a majority no longer held it."""
        results = fanout.run_on_all(
            self.servers,
            REDLOCK_FENCE,
            REDLOCK_FENCE.keys_of({"lock": self.lock_key, "fence": self.fence_key}),
            REDLOCK_FENCE.args_of(token=self.token, fencing_token=self.candidate_fence),
            timeout=max(self.lease_deadline - time.monotonic(), 0.001),
            enough=quorum(len(self.servers.clients)),
        )
        if sum(1 for r in results if r == 1) < quorum(len(results)):
            self.mark_lost("a majority no longer held it when its fencing token was read")
            return False
        self.fencing_token = self.candidate_fence
        return True

    def send_lease(self, lease: float) -> bool:
        return self.extend_all(lease)

    def deadline_of(self, started: float, lease: float) -> float:
        return started + lease - drift(lease)
