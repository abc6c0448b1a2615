"""What ``Leadership`` and ``AsyncLeadership`` share: one leader per name, however many campaign.

A leadership is a ``Lock`` (an ``AsyncLock``) on ``leader:<name>``, held for as
long as this process leads, renewed by the watchdog, and taken with its
fencing token: campaigning is the lock's fair, event-driven wait (a standby is
a queued waiter, woken by the leader's release), so the first standby in line
takes over the moment the leader resigns, and when the leader's lease runs out
the next re-check takes it. ``operators`` see the lock as kind ``leadership``
(``ops/kinds.py``).

Timeline of a failover (``docs/long-holds.md`` has the bound)::

    leader  elected -> renewals every timeout/3 ... (dies, or is paused)
    standby queued on leader:<name> ........ its wait ends when the lease would
                                             have ended -> takes the lock: leader

What "leading" means here is what the leader knows: ``is_leader`` is false
from the moment the lease is known lost (a renewal found it gone, or could
not be made before its end: the lock's ``on_lost``) or ``resign()`` is called; a leader paused past
its lease cannot know until it resumes, which is why every leader carries a
fencing token (``fencing_token``) to pass to what it writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django_redislock.backend import client as backend
from django_redislock.backend.values import HolderInfo, parse_lock_value
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.lock import Lock
from django_redislock.validation import check_alias, check_bool, check_name, check_seconds

logger = logging.getLogger(__name__)

#: A leadership's lock is named ``leader:<name>``: the tools tell leaderships
#: from locks by it (``ops/kinds.py``), and no lock of the same name collides.
LEADER_PREFIX = "leader:"
#: How long one wait of a campaign without a bound lasts before it queues
#: again (each wait is event-driven; this only bounds one acquire).
CAMPAIGN_CHUNK = 3600.0
#: A campaign that meets an unreachable Redis tries again after this long,
#: doubled up to ``MAX_RETRY`` (``campaign_again`` and ``manage.py lead``).
FIRST_RETRY = 0.1
MAX_RETRY = 5.0

L = TypeVar("L", bound="Lock | AsyncLock")


class LeaderLock(Lock):
    kind = "leadership"
    noun = "leadership"


class AsyncLeaderLock(AsyncLock):
    kind = "leadership"
    noun = "leadership"


def check_callback(value: object, argument: str) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be a callable or None, not {type(value).__name__}.")
    return value


def already_leading(name: str) -> RuntimeError:
    return RuntimeError(
        f"This thread (or task) already leads {name!r} through another Leadership: "
        "a process campaigns once per name and thread."
    )


def leader_of(name: str, using: str | None = None) -> HolderInfo | None:
    """Who leads ``name`` now (``None``: nobody), read with one pipelined
    ``GET`` + ``PTTL``; campaigns for nothing."""
    lock = LeaderLock(LEADER_PREFIX + check_name(name), using=check_alias(using))
    settings = lock._settings()
    keys, _ = lock._key_set(lock._prefix(settings))
    with backend.translate_errors(lock.name):
        pipe = lock._client(settings).pipeline(transaction=False)
        pipe.get(keys[0])
        pipe.pttl(keys[0])
        value, pttl = pipe.execute()
    state = parse_lock_value(value)
    if state is None:
        return None
    return HolderInfo(
        token=state.token,
        holder=state.holder,
        ttl=pttl / 1000.0 if pttl >= 0 else None,
        fencing_token=state.fencing_token or None,
        count=state.count,
        since=state.since,
        lease=state.lease,
        handed_over=state.handed_over,
    )


class Campaigner(Generic[L]):
    """What both leaderships share: state, callbacks and the loss hook; no I/O."""

    _lock: L

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None,
        blocking_timeout: float | None,
        using: str | None,
        on_elected: Callable[..., Any] | None,
        on_revoked: Callable[..., Any] | None,
        campaign_again: bool,
    ) -> None:
        self.name = check_name(name)
        self._blocking_timeout = check_seconds(
            blocking_timeout, "blocking_timeout", allow_zero=True
        )
        self._on_elected = check_callback(on_elected, "on_elected")
        self._on_revoked = check_callback(on_revoked, "on_revoked")
        self.campaign_again = bool(check_bool(campaign_again, "campaign_again", allow_none=False))
        self.using = check_alias(using)
        self._lock_args = {
            "timeout": timeout,
            "using": using,
            "auto_renew": True,
            "fencing": True,
            "on_lost": self._lost,
        }
        self._state = threading.RLock()
        self._holding: Holding | None = None
        self._leading = False
        self._closed = False
        self._revoked = threading.Event()
        self._revoked.set()
        self._elected = threading.Event()  # set while a term runs (_revoked's complement)
        #: Elections won by this object so far.
        self.terms = 0

    @property
    def is_leader(self) -> bool:
        """Whether this process leads, as far as it knows (no round trip):
        false from the moment its hold is known lost (``hold.lost``), before
        ``on_revoked`` runs, and from the moment ``resign()`` is called; and
        in a child forked from the leader (the hold is its parent's)."""
        holding = self._holding
        return (
            self._leading
            and holding is not None
            and holding.lost is None
            and holding.pid == current_pid()  # a forked child leads nothing
        )

    @property
    def fencing_token(self) -> int | None:
        """The current term's fencing token (``None`` when not leading): greater
        than every earlier leader's. Pass it to what the leader writes, so
        that a leader paused past its lease is refused when it resumes."""
        holding = self._holding
        return holding.fencing_token if holding is not None and self.is_leader else None

    @staticmethod
    def leader_of(name: str, using: str | None = None) -> HolderInfo | None:
        """Who leads ``name`` now, or ``None``; no campaigning (one round trip)."""
        return leader_of(name, using)

    def wait_revoked(self, timeout: float | None = None) -> bool:
        """Block until this process does not lead (``True``), or ``timeout``
        seconds passed while it still leads (``False``). Event-driven."""
        return self._revoked.wait(check_seconds(timeout, "timeout", allow_zero=True))

    def _budget(self, blocking_timeout: float | None) -> float | None:
        if blocking_timeout is None:
            return self._blocking_timeout
        return check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)

    def _won(self, holding: Holding) -> bool:
        """Record an election; ``False`` when this object resigned meanwhile
        (then the caller releases at once)."""
        with self._state:
            if self._closed:
                return False
            self._holding, self._leading = holding, True
            self.terms += 1
            self._revoked.clear()
            self._elected.set()
        if holding.lost is not None:  # lost before it was recorded: its on_lost found no term
            self._step_down(holding, holding.lost)
        return True

    def _lost(self, handle: object) -> None:
        """The lock's ``on_lost`` (on the process's loss-callback thread,
        ``holds/losses.py``): the current term's hold is lost, step down."""
        holding = self._holding
        if holding is not None and holding.lost is not None:
            self._step_down(holding, holding.lost)

    def _step_down(self, holding: Holding, reason: str | None) -> bool:
        """The term of ``holding`` is over (lost, or resigned: ``reason`` None);
        ``False`` when it was over already. ``is_leader`` is false from here."""
        with self._state:
            if self._holding is not holding or not self._leading:
                return False
            self._leading = False
            self._elected.clear()
            self._revoked.set()
        if reason is not None:
            logger.warning("Leadership %r revoked: %s", self.name, reason)
        return True

    def _call(self, callback: Callable[..., Any] | None, event: str) -> Any:
        """Run a user callback; its exception is logged, never raised."""
        if callback is None:
            return None
        try:
            return callback(self)
        except Exception:
            logger.exception("The %s callback of leadership %r failed", event, self.name)
            return None

    def __repr__(self) -> str:
        state = "leading" if self.is_leader else "not leading"
        return f"<{type(self).__name__} {self.name!r} {state}>"
