"""``Redlock``: a lock granted by a majority of independent Redis servers.

The algorithm (antirez, "Distributed locks with Redis"): write the lock with
one token and lease to every server at once; it is held when a majority
granted it and the time spent getting there, plus an allowance for clock
drift, leaves some of the lease. Otherwise every server is told to release and
the attempt is retried after a random delay. With N servers up to (N - 1) / 2
may be down or partitioned away.

Each server runs the same ``lock_*.lua`` scripts as ``Lock`` (in ``try``
mode: no queue), under its own key part, so a ``Redlock`` never collides with a
``Lock`` of the same name on a shared server.

Why waiting polls: a ``Lock`` waiter sleeps on a list that the releasing
script pushes to, on the one server that decides. A Redlock has no such
server: a waiter woken by one server still needs a majority, and per-server
queues order waiters differently, so waiters would each win a minority and
livelock. Waiters therefore retry after a random, growing delay (``RETRY_MIN``
to ``RETRY_MAX``, never past the holder's remaining lease or the caller's
deadline), which is what keeps competing waiters from colliding again.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import backend, fanout, signals
from .base import FENCE_MEMORY_MS
from .conf import LockSettings, get_settings
from .exceptions import LockLostError, LockNotOwnedError, LockTimeout
from .holding import Holding, current_pid, holder_description, new_token
from .locks import ACQUIRED, acquire_reply
from .protocol import REFUSED
from .quorum import (
    _PARTS,
    RETRY_MAX,
    RETRY_MIN,
    RedlockHolding,
    _too_few_error,
    drift,
    quorum,
    reply_timeout,
)
from .scripts import LOCK_ACQUIRE, LOCK_RELEASE, REDLOCK_FENCE
from .state import parse_lock_value
from .validation import check_bool, check_lease, check_name, check_seconds, wait_budget
from .watchdog import watchdog

logger = logging.getLogger(__name__)


def _check_aliases(using: object) -> tuple[str, ...] | None:
    if using is None:
        return None
    if isinstance(using, str) or not isinstance(using, Sequence):
        raise TypeError(
            f"using must be a list of cache aliases of independent Redis servers, not {using!r}."
        )
    aliases = tuple(using)
    if not all(isinstance(a, str) and a for a in aliases):
        raise TypeError(f"using must hold non-empty cache alias strings, got {list(aliases)!r}.")
    if len(aliases) < 3 or len(set(aliases)) != len(aliases):
        raise ValueError(f"using needs at least 3 distinct cache aliases, got {list(aliases)!r}.")
    return aliases


class Redlock:
    """A lock on ``name`` held when a majority of independent Redis servers grant it.

    Use it when no single Redis (even with Sentinel) may decide alone: the
    lock survives the loss of any minority of the servers named in
    ``REDISLOCK["REDLOCK"]`` (or ``using``). Same API as ``Lock``:
    ``acquire``/``release``/``extend``/``locked``/``owned``/``ttl``, a context
    manager raising ``LockTimeout``, reentrancy per holder, and a watchdog that
    extends the lease on every server and reports ``lock_lost`` /
    ``LockLostError`` once a majority no longer holds it.

    Differences from ``Lock``: waiting polls with random back-off (there is no
    single server to be woken by) so it is not FIFO-fair; a majority of
    servers unreachable is a ``LockBackendError`` at once. ``fencing_token`` is
    computed on first read, which costs one round trip (see its docstring).
    """

    kind = "redlock"

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: Sequence[str] | None = None,
    ) -> None:
        self.name = check_name(name)
        self.timeout = check_lease(timeout)
        self.blocking = bool(check_bool(blocking, "blocking", allow_none=False))
        self.blocking_timeout = check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
        self.auto_renew = check_bool(auto_renew, "auto_renew")
        self.using = _check_aliases(using)
        self._local = threading.local()
        self._keys: tuple[str, list[str]] | None = None

    def __repr__(self) -> str:
        return f"<Redlock {self.name!r}>"

    # configuration ----------------------------------------------------------------

    def _aliases(self, settings: LockSettings) -> tuple[str, ...]:
        aliases = self.using or settings.redlock
        if len(aliases) < 3:
            raise ImproperlyConfigured(
                f"Redlock {self.name!r} needs REDISLOCK['REDLOCK'] to list at least 3 cache "
                f"aliases of independent Redis servers (or using=[...]); got {list(aliases)!r}."
            )
        return aliases

    def _clients(self, settings: LockSettings) -> list[Any]:
        return [backend.get_client(alias) for alias in self._aliases(settings)]

    def _key_list(self, prefix: str) -> list[str]:
        cached = self._keys
        if cached is not None and cached[0] == prefix:
            return cached[1]
        keys = [backend.key(prefix, self.name, part) for part in _PARTS]
        self._keys = (prefix, keys)
        return keys

    def _holding(self) -> RedlockHolding | None:
        holding: RedlockHolding | None = getattr(self._local, "holding", None)
        if holding is not None and holding.pid != current_pid():
            self._local.holding = None  # inherited through fork(): not ours
            return None
        return holding

    # acquire --------------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock on a majority; ``False`` when it could not be taken in time.

        Raises ``LockBackendError`` when fewer than a majority of the servers
        answer (waiting would not help), ``ImproperlyConfigured`` when fewer
        than three servers are configured.
        """
        return self._acquire(blocking, blocking_timeout) is None

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> float | None:
        """Acquire; ``None`` when held, else seconds after which a retry may succeed."""
        settings = get_settings()
        clients = self._clients(settings)
        keys = self._key_list(settings.key_prefix)
        lease = self.timeout if self.timeout is not None else settings.timeout
        holding = self._holding()
        if holding is not None:
            if not self._extend_holding(holding, holding.lease, "acquired it again"):
                raise self._lost(holding)
            holding.depth += 1
            return None

        _, budget = wait_budget(self, blocking, blocking_timeout, settings)
        lease_ms = int(lease * 1000)
        allowance = drift(lease)
        token, holder = new_token(), holder_description()
        args = [
            token,
            lease_ms,
            "try",
            0,
            keys[0] + ":signal:",
            holder,
            FENCE_MEMORY_MS,
            int(time.time() * 1000),
        ]
        needed = quorum(len(clients))
        begun = time.monotonic()
        deadline = None if budget is None else begun + budget
        delay = RETRY_MIN
        while True:
            started = time.monotonic()
            try:
                results = fanout.run_on_all(
                    clients, LOCK_ACQUIRE, keys, args, timeout=reply_timeout(lease, allowance)
                )
            except BaseException:  # interrupted mid-way: undo wherever it may have landed
                self._release_quietly(clients, keys, token, [None] * len(clients))
                raise
            replies = [acquire_reply(r) if isinstance(r, int) else None for r in results]
            granted = [r[1] for r in replies if r is not None and r[0] == ACQUIRED]
            validity = lease - (time.monotonic() - started) - allowance
            if len(granted) >= needed and validity > 0:
                break
            self._release_quietly(clients, keys, token, results)
            failures = sum(1 for r in results if isinstance(r, BaseException))
            if len(clients) - failures < needed:
                raise _too_few_error(self.name, results, "acquire")
            retry_after = self._retry_after(replies, needed)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                signals.notify(
                    signals.lock_contended,
                    sender=type(self),
                    name=self.name,
                    kind=self.kind,
                    waited=now - begun,
                )
                return retry_after
            pause = random.uniform(0.5, 1.0) * delay
            if retry_after > 0:
                pause = min(pause, retry_after)
            if deadline is not None:
                pause = min(pause, deadline - now)
            time.sleep(max(pause, 0.0))
            delay = min(delay * 2, RETRY_MAX)

        holding = RedlockHolding(
            clients=clients,
            lock_key=keys[0],
            fence_key=keys[1],
            candidate_fence=max(int(f) for f in granted),
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=token,
            holder=holder,
            lease=lease,
            started=started,
            keys=[keys[0], keys[2], keys[3]],
        )
        self._local.holding = holding
        if self.auto_renew if self.auto_renew is not None else settings.auto_renew:
            watchdog.watch(holding)
        signals.notify(
            signals.lock_acquired,
            sender=type(self),
            name=self.name,
            kind=self.kind,
            waited=started - begun,
            fencing_token=None,
        )
        return None

    @staticmethod
    def _retry_after(replies: list[tuple[int, int] | None], needed: int) -> float:
        """When enough current holders' leases end for a majority to be free
        (``replies``: decoded acquire replies, ``None`` for a failed server)."""
        hints = sorted(r[1] for r in replies if r is not None and r[0] == REFUSED)
        free = len(replies) - len(hints)
        missing = needed - free
        if missing <= 0 or not hints:
            return 0.0
        return hints[min(missing, len(hints)) - 1] / 1000.0

    def _release_quietly(
        self, clients: list[Any], keys: list[str], token: str, results: list[Any]
    ) -> None:
        """Undo a failed attempt wherever it may have been granted (``None``: unknown)."""
        touched = [
            c
            for c, r in zip(clients, results, strict=True)
            if r is None or isinstance(r, BaseException) or (isinstance(r, int) and r > 0)
        ]
        if touched:
            try:
                fanout.run_on_all(
                    touched, LOCK_RELEASE, [keys[0], keys[2], keys[3]], [token, ""], timeout=1.0
                )
            except Exception as exc:  # best effort: the leases run out by themselves
                logger.debug("Could not undo a failed attempt on %r: %s", self.name, exc)

    # fencing ------------------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """This holder's fencing token, ``None`` when not held.

        The first read records the token (the largest counter among the
        granting servers) on every server that still has this hold, one round
        trip; a majority of them did, and each of them gives any later holder a
        larger counter, so later holders' tokens are larger. The counters start
        from each server's clock in µs, so the order also survives a server
        restarting empty as long as server clocks agree to within
        ``FENCE_MEMORY_MS``. Raises ``LockLostError`` when a majority no
        longer holds the lock: a token of a lost lock must not be used.
        """
        holding = self._holding()
        if holding is None:
            return None
        if holding.fencing_token is None:
            results = fanout.run_on_all(
                holding.clients,
                REDLOCK_FENCE,
                [holding.lock_key, holding.fence_key],
                [holding.token, holding.candidate_fence, FENCE_MEMORY_MS],
                timeout=max(holding.lease_deadline - time.monotonic(), 0.001),
            )
            if sum(1 for r in results if r == 1) < quorum(len(results)):
                holding.mark_lost("a majority no longer held it when its fencing token was read")
                raise self._lost(holding)
            holding.fencing_token = holding.candidate_fence
        return holding.fencing_token

    # release, extend, inspect ------------------------------------------------------

    def release(self) -> None:
        """Release one level of this holder's hold; the last level releases everywhere.

        ``LockLostError`` when the lock had been lost; ``LockBackendError`` when
        too few servers answered (the leases left behind run out by themselves).
        """
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        if holding.depth > 1:
            holding.depth -= 1
            return
        self._local.holding = None
        holding.releasing = True
        watchdog.unwatch(holding)
        results = fanout.run_on_all(
            holding.clients,
            LOCK_RELEASE,
            holding.keys,
            [holding.token, ""],
            timeout=max(holding.lease, 1.0),
        )
        released = sum(1 for r in results if r == 0)
        not_ours = sum(1 for r in results if r == -1)
        needed = quorum(len(results))
        if released < needed and len(results) - not_ours < needed:
            holding.mark_lost("a majority no longer held it when it was released")
        holding.end()
        if holding.lost is not None:
            raise self._lost(holding)
        if released < needed:
            raise _too_few_error(self.name, results, "release")
        signals.notify(
            signals.lock_released,
            sender=type(self),
            name=self.name,
            kind=self.kind,
            held=time.monotonic() - holding.acquired_at,
        )

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease from now on, on every server (see ``Lock.extend``)."""
        lease = check_lease(seconds, "seconds")
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        lease = lease or holding.lease
        if not self._extend_holding(holding, lease, "extended it"):
            raise self._lost(holding)
        watchdog.reschedule(holding)

    def _extend_holding(self, holding: RedlockHolding, lease: float, action: str) -> bool:
        if holding.lost is not None:
            return False
        if holding.extend_all(lease):
            return True
        holding.mark_lost(f"a majority no longer held it when the holder {action}")
        return False

    def _states(self) -> list[Any]:
        settings = get_settings()
        key = self._key_list(settings.key_prefix)[0]
        states: list[Any] = []
        for client in self._clients(settings):
            try:
                pipe = client.pipeline(transaction=False)
                pipe.get(key)
                pipe.pttl(key)
                states.append(pipe.execute())
            except backend.BACKEND_ERRORS as exc:
                states.append(exc)
        return states

    def _quorum_view(self) -> tuple[list[tuple[bytes | None, int]], int]:
        states = self._states()
        answered = [s for s in states if not isinstance(s, BaseException)]
        if len(answered) < quorum(len(states)):
            raise _too_few_error(self.name, states, "inspect")
        return answered, quorum(len(states))

    def locked(self) -> bool:
        """Whether a majority of the servers hold the lock for anyone right now."""
        answered, needed = self._quorum_view()
        return sum(1 for value, _ in answered if value is not None) >= needed

    def owned(self) -> bool:
        """Whether a majority of the servers hold the lock for this holder."""
        holding = self._holding()
        if holding is None:
            return False
        answered, needed = self._quorum_view()
        found = (parse_lock_value(value) for value, _ in answered)
        return sum(1 for state in found if state and state.token == holding.token) >= needed

    def ttl(self) -> float | None:
        """Seconds a majority of the servers will keep holding it, or ``None`` when free."""
        answered, needed = self._quorum_view()
        remaining = sorted((pttl for value, pttl in answered if value is not None), reverse=True)
        if len(remaining) < needed:
            return None
        return max(remaining[needed - 1], 0) / 1000.0

    # errors -----------------------------------------------------------------------------

    def _not_owned(self) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"Redlock {self.name!r} is not held by this holder.", name=self.name
        )

    def _lost(self, holding: Holding) -> LockLostError:
        reason = holding.lost or "the lease expired or was cleared before release"
        return LockLostError(f"Redlock {self.name!r} was lost: {reason}.", name=self.name)

    # context manager ------------------------------------------------------------------

    def __enter__(self) -> Redlock:
        retry = self._acquire(None, None)
        if retry is not None:
            raise LockTimeout(
                f"Could not acquire redlock {self.name!r} in time.",
                name=self.name,
                retry_after=retry if retry > 0 and math.isfinite(retry) else None,
            )
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
            if exc is None:
                raise
            if sys.version_info >= (3, 11):
                exc.add_note(f"django-redislock: {error}")
