"""``Redlock``: a lock granted by a majority of independent Redis servers.

The algorithm (antirez, "Distributed locks with Redis"): write the lock with
one token and lease to every server at once; it is held when a majority
granted it and the time spent getting there, plus an allowance for clock
drift, leaves some of the lease. Otherwise every server is told to release and
the attempt is retried after a random delay. With N servers up to (N - 1) / 2
may be down or partitioned away.

The pieces: ``quorum`` (the acquire, written once without I/O, and the
majority arithmetic), ``fanout.run_quorum`` and ``fanout`` (every server at
once, through redis-py's public API), ``redlock_servers`` (which servers, and
the lock-script calls made there), ``redlock_holding`` (renewal on a majority).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

import django_redislock.primitives.redlock.fanout as fanout
from django_redislock import signals
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE
from django_redislock.conf import LockSettings, get_settings
from django_redislock.engine.steps import HELD_RESULT, AcquireResult
from django_redislock.exceptions import (
    LockBackendError,
)
from django_redislock.holds import counters, losses
from django_redislock.holds.holding import holder_description, new_token
from django_redislock.holds.losses import LossOptions
from django_redislock.holds.registry import THREAD_HANDLES, HoldKey
from django_redislock.holds.watchdog import watchdog
from django_redislock.primitives import guarded, told
from django_redislock.primitives.guarded import Worded
from django_redislock.primitives.redlock.fanout import Servers
from django_redislock.primitives.redlock.holding import RedlockHolding
from django_redislock.primitives.redlock.quorum import (
    MIN_LEASE,
    QuorumAttempt,
    check_lease,
    too_short,
)
from django_redislock.primitives.redlock.quorum import acquire as quorum_acquire
from django_redislock.primitives.redlock.servers import (
    by_token,
    check_aliases,
    key_list,
    lock_call,
    majority_holder,
    namespace_for,
    servers_for,
    view,
)
from django_redislock.validation import check_name, checked_options, fixed, wait_budget

_R = TypeVar("_R", bound="Redlock")


class Redlock(Worded):
    """A lock on ``name`` held when a majority of independent Redis servers grant it.

    Use it when no single Redis (even with Sentinel) may decide alone: the
    lock survives the loss of any minority of the servers named in
    ``REDISLOCK["REDLOCK"]`` (or ``using``). Same API as ``Lock``:
    ``acquire``/``release``/``extend``/``locked``/``owned``/``ttl``, a context
    manager raising ``LockTimeout``, and a watchdog that extends the lease on
    every server and reports ``lock_lost`` / ``LockLostError`` once a majority
    no longer holds it; as every hold, ``lost``, ``check()``, ``on_lost`` and
    ``max_hold`` tell the holder while it holds (``primitives/told.py``).
    Reentrant per thread, as ``Lock``: any ``Redlock`` for the same name and
    servers (the same set of aliases) in the holding thread re-enters the hold
    instead of waiting on itself (``holds/registry.py``).

    The lease (``timeout``) is at least ``quorum.MIN_LEASE`` (10 ms): the
    drift allowance would leave a shorter one no validity to work with.

    Differences from ``Lock``: waiting polls with random back-off (there is no
    single server to be woken by) so it is not FIFO-fair; a majority of
    servers unreachable is a ``LockBackendError`` at once. ``fencing_token`` is
    computed on first read, which costs one round trip (see its docstring).
    """

    kind = "redlock"
    #: Who holds what this handle took: the thread (``holds/registry.py``).
    _handles = THREAD_HANDLES
    #: Its loss options (``primitives/told.py``), when given.
    _loss: LossOptions | None = None
    asyncio_holds = False
    # fixed when built, as Lock's: the keys and servers are worked out from them once
    name: str = fixed("name")
    using: tuple[str, ...] | None = fixed("using")

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: Sequence[str] | None = None,
        on_lost: Callable[[Redlock], object] | None = None,
        max_hold: float | None = None,
    ) -> None:
        self._name = check_name(name)
        check_lease(timeout)
        self._timeout, self._blocking, self._blocking_timeout, self._auto_renew = checked_options(
            timeout, blocking, blocking_timeout, auto_renew
        )
        self._using = check_aliases(using)
        if on_lost is not None or max_hold is not None:
            self._loss = losses.loss_options(on_lost, max_hold, False, asyncio_holds=False)
        #: what this handle entered in each thread (``THREAD_HANDLES``)
        self._local = threading.local()
        self._keys: tuple[str, list[str]] | None = None

    def __repr__(self) -> str:
        return f"<Redlock {self.name!r}>"

    def __enter__(self: _R) -> _R:
        return guarded.enter(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        guarded.leave(self, exc_type, exc)

    # what the holder is told of a loss while it holds: primitives/told.py ------------

    @property
    def on_lost(self) -> Any:
        """The ``on_lost`` option: called once with this handle when a hold's lease is lost."""
        return self._loss.on_lost if self._loss is not None else None

    @property
    def max_hold(self) -> float | None:
        """The ``max_hold`` option (``None``: ``REDISLOCK["MAX_HOLD"]`` applies)."""
        return self._loss.max_hold if self._loss is not None else None

    @property
    def cancel_on_loss(self) -> bool:
        """Always ``False``: a ``Redlock``'s holds are threads'."""
        return False

    @property
    def lost(self) -> bool:
        """Whether this thread's hold is known lost (no round trip; see ``told.lost``)."""
        return told.lost(self)

    def check(self) -> None:
        """Raise ``LockLostError`` if ``lost``; otherwise do nothing (no round trip)."""
        told.check(self)

    # configuration ----------------------------------------------------------------

    def _aliases(self, settings: LockSettings) -> tuple[str, ...]:
        aliases = self.using or settings.redlock
        if len(aliases) < 3:
            raise ImproperlyConfigured(
                f"Redlock {self.name!r} needs REDISLOCK['REDLOCK'] to list at least 3 cache "
                f"aliases of independent Redis servers (or using=[...]); got {list(aliases)!r}."
            )
        return aliases

    def _servers(self, settings: LockSettings) -> Servers:
        return servers_for(self._aliases(settings))

    def _key_list(self, settings: LockSettings) -> list[str]:
        """Its keys, in the namespace its caches share (``backend.namespace``)."""
        prefix = namespace_for(self._aliases(settings), settings.key_prefix)
        cached = self._keys
        if cached is not None and cached[0] == prefix:
            return cached[1]
        keys = key_list(prefix, self.name)
        self._keys = (prefix, keys)
        return keys

    def _lease(self, settings: LockSettings) -> float:
        if self.timeout is not None:
            return self.timeout
        if settings.timeout < MIN_LEASE:
            raise ImproperlyConfigured(
                f"Redlock {self.name!r} has no timeout and "
                + too_short("REDISLOCK['TIMEOUT']", settings.timeout)
            )
        return settings.timeout

    def _renewed(self, settings: LockSettings) -> bool:
        return self.auto_renew if self.auto_renew is not None else settings.auto_renew

    # holder state: the thread, as for Lock (see holds/registry.py) -------------------------

    @staticmethod
    def _quorum_key(aliases: tuple[str, ...], keys: list[str]) -> HoldKey:
        """The same servers named in any order are the same holder's hold."""
        return (tuple(sorted(aliases)), keys[0])

    def _own_hold_key(self) -> HoldKey:
        settings = get_settings()
        return self._quorum_key(self._aliases(settings), self._key_list(settings))

    def _holding(self) -> RedlockHolding | None:
        """The hold this handle's release, extend, ``owned`` and token apply to."""
        holding = self._handles.current(self, None)
        assert holding is None or isinstance(holding, RedlockHolding)
        return holding

    _hold_now = _holding

    # acquire --------------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, blocking_timeout: float | None = None) -> bool:
        """Take the lock on a majority; ``False`` when it could not be taken in time.

        Raises ``LockBackendError`` when fewer than a majority of the servers
        answer (waiting would not help), ``ImproperlyConfigured`` when fewer
        than three servers are configured.
        """
        return self._acquire(blocking, blocking_timeout).held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> AcquireResult:
        """Acquire: held, or refused with when enough leases end for a majority."""
        settings = get_settings()
        aliases = self._aliases(settings)
        servers = servers_for(aliases)
        keys = self._key_list(settings)
        lease = self._lease(settings)
        if self._renewed(settings):  # no thread, no grant (watchdog.ensure_running)
            watchdog.ensure_running()
        hold_key = self._quorum_key(aliases, keys)
        holding = self._handles.reentry(hold_key)
        if holding is not None:
            assert isinstance(holding, RedlockHolding)
            if self._extend_holding(holding, holding.lease, "acquired it again"):
                holding.depth += 1
                self._handles.took(self, hold_key, holding)
                return HELD_RESULT
            holding.end()  # reported lost by _extend_holding; taken afresh below
        may_wait, budget = wait_budget(self, blocking, blocking_timeout, settings)
        token, holder, begun = new_token(), holder_description(), time.monotonic()
        attempt = QuorumAttempt(
            name=self.name,
            call=lock_call(LOCK_ACQUIRE, keys, token, lease_ms=int(lease * 1000), holder=holder),
            undo=lock_call(LOCK_RELEASE, keys, token),
            count=len(servers),
            lease=lease,
            deadline=None if budget is None else begun + budget,
        )
        outcome = fanout.run_quorum(quorum_acquire(attempt), servers)
        if not outcome.held:
            refused = AcquireResult.refused(outcome.value, outcome.refusal)
            counters.contended(self.name, time.monotonic() - begun)
            signals.announce_contended(self, begun, may_wait, refused.holder, refused.held_for)
            return refused
        holding = RedlockHolding(
            servers=servers,
            redlock_keys=keys,
            candidate_fence=outcome.value,
            sender=type(self),
            name=self.name,
            kind=self.kind,
            token=token,
            holder=holder,
            lease=lease,
            started=outcome.started,
        )
        self._hold(hold_key, holding, settings, waited=outcome.started - begun)
        return HELD_RESULT

    def _hold(
        self, hold_key: HoldKey, holding: RedlockHolding, settings: LockSettings, waited: float
    ) -> None:
        """Record a new hold: this thread's, with what it asked for on loss,
        watched, announced."""
        if self._loss is not None or settings.max_hold is not None:
            told.attach_hooks(self, holding, settings)
        self._handles.took(self, hold_key, holding)
        if self._renewed(settings):
            watchdog.watch(holding)
        counters.acquired(None, None, 0, self.name, waited)
        signals.announce_acquired(self, waited, None)

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
        ``FENCE_MEMORY_MS`` (``backend/scripts/_queue.lua``). Raises
        ``LockLostError`` when a majority no longer holds the lock: a token of a
        lost lock must not be used. So every
        read, not only the first, checks that the hold was not found lost (by
        the watchdog, an extend, a nested acquire) and that its lease, as this
        holder measures it, has not ended: the cached token is returned only
        while both hold.
        """
        holding = self._holding()
        if holding is None:
            return None
        if holding.lost is None and time.monotonic() >= holding.lease_deadline:
            holding.mark_lost("its lease had ended when its fencing token was read")
        if holding.lost is not None:
            raise self._lost(holding)
        if holding.fencing_token is None and not holding.record_fence():
            raise self._lost(holding)
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
        try:
            if holding.depth > 1:
                holding.depth -= 1
                return
            self._release_all(holding)
        finally:
            self._handles.left(self, holding)

    def _release_all(self, holding: RedlockHolding) -> None:
        """The last level's release, on every server."""
        holding.releasing = True
        watchdog.unwatch(holding)
        try:
            failed = holding.release_everywhere()
        finally:
            holding.end()  # not renewed any more: what is left the leases free
        if holding.lost is not None:
            raise self._lost(holding) from failed
        if failed is not None:
            raise failed from failed.__cause__
        signals.announce_released(self, holding.acquired_at)

    def extend(self, seconds: float | None = None) -> None:
        """Make ``seconds`` the lease from now on, on every server (see ``Lock.extend``).

        Below ``quorum.MIN_LEASE`` (10 ms) is a ``ValueError``."""
        lease = check_lease(seconds, "seconds")
        holding = self._holding()
        if holding is None:
            raise self._not_owned()
        lease = lease or holding.lease
        if not self._extend_holding(holding, lease, "extended it"):
            raise self._lost(holding)

    def _extend_holding(self, holding: RedlockHolding, lease: float, action: str) -> bool:
        """Extend on every server; ``False`` when the hold is lost (reported),
        also when too few servers answered and its lease had ended before the
        extend was sent (``LockLostError`` chained to that ``LockBackendError``)."""
        if holding.lost is not None:
            return False
        sent = time.monotonic()
        with holding.extending(lease) as extended:
            try:
                ours = holding.extend_all(lease)
            except LockBackendError as exc:
                if holding.lapsed(sent, action):
                    raise self._lost(holding) from exc
                raise
            if ours:
                extended()
        if ours:
            return holding.lost is None  # reported lost while the extend was on its way
        holding.mark_lost(f"a majority no longer held it when the holder {action}")
        return False

    def _view(self) -> tuple[list[tuple[bytes | None, int]], int]:
        """What a majority answers about the lock key (``redlock_servers.view``)."""
        settings = get_settings()
        return view(self._servers(settings), self._key_list(settings)[0], self.name)

    def locked(self) -> bool:
        """Whether one holder holds the lock on a majority of the servers right now."""
        return majority_holder(*self._view()) is not None

    def owned(self) -> bool:
        """Whether a majority of the servers hold the lock for this holder."""
        holding = self._holding()
        if holding is None:
            return False
        answered, needed = self._view()
        return len(by_token(answered).get(holding.token, ())) >= needed

    def ttl(self) -> float | None:
        """Seconds a majority of the servers will keep holding it, or ``None`` when free."""
        answered, needed = self._view()
        pttls = majority_holder(answered, needed)
        if pttls is None:
            return None
        return max(sorted(pttls, reverse=True)[needed - 1], 0) / 1000.0
