"""A holding: one holder's claim on a primitive, and who the holder is.

A holding carries the holder's unguessable token, its nesting depth, its
fencing token and lease; the watchdog renews it, and it reports its own loss
(``lock_lost``, a WARNING log line). Holdings belong to one thread (sync) or
one task (async) of one process (``holds/registry.py``); a holding seen from another
process (after ``fork()``) is ignored, so a child never releases or renews its
parent's claim.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django_redislock import context, signals
from django_redislock.backend import client as backend
from django_redislock.engine import pool
from django_redislock.holds import counters
from django_redislock.holds.renewals import RENEWAL_SENDS
from django_redislock.holds.watchdog import watchdog

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script
    from django_redislock.holds.losses import LossHooks

logger = logging.getLogger(__name__)


@functools.cache
def _hostname() -> str:
    return socket.gethostname()


#: The process's id, asked anew each time: fork-time hooks do not run
#: everywhere (uWSGI without ``py-call-osafterfork``).
current_pid = os.getpid


@functools.cache
def _holder_prefix(pid: int) -> str:
    return f"{_hostname()}:{pid}:"


def holder_description(pid: int | None = None) -> str:
    """Who holds a lock, for operators: ``host:pid:thread``, then ``" | "`` and
    what it runs when known (``context.current``). ``pid``: this process's,
    when the caller has just asked (each ``os.getpid()`` is a system call)."""
    who = _holder_prefix(pid or os.getpid()) + threading.current_thread().name
    what = context.current()
    return who if what is None else who + context.SEPARATOR + what


def new_token() -> str:
    """128 bits from the OS, in hex: ``secrets.token_hex(16)``, without its
    three Python calls on every acquire."""
    return os.urandom(16).hex()


class Holding:
    """One holder's claim; also what the watchdog renews."""

    __slots__ = (
        "__weakref__",
        "acquired_at",
        "active",
        "client",
        "depth",
        "detached",
        "fencing_token",
        "holder",
        "hooks",
        "keys",
        "kind",
        "lease",
        "lease_deadline",
        "lease_generation",
        "lease_lock",
        "lost",
        "name",
        "pid",
        "release_args",
        "releasing",
        "renew_keys",
        "renew_script",
        "renewing_lease",
        "sender",
        "sigprefix",
        "slot",
        "stats_key",
        "stats_ttl_ms",
        "token",
        "watch_state",
    )

    def __init__(  # positional too: a Lock's acquire builds one per call (LockBase._new_holding)
        self,
        sender: type,
        name: str,
        kind: str,
        token: str,
        holder: str,
        client: Any,
        lease: float,
        started: float,
        fencing_token: int | None,
        renew_script: Script,
        renew_keys: Sequence[str | bytes],
        keys: Sequence[str | bytes],
        sigprefix: str | bytes = "",
        stats_key: bytes | None = None,
        stats_ttl_ms: int = 0,
        pid: int | None = None,
    ) -> None:
        """``pid``: this process's, when the caller has it (see ``holder_description``)."""
        self.sender = sender
        self.stats_key = stats_key
        self.stats_ttl_ms = stats_ttl_ms
        self.name = name
        self.kind = kind
        self.token = token
        self.client = client
        self.lease = lease
        self.depth = 1
        self.pid = pid or os.getpid()
        self.fencing_token = fencing_token
        self.acquired_at = time.monotonic()
        self.holder = holder  # as the acquire described it (holder_description)
        # Measured from before the request was sent: never later than Redis's view.
        self.lease_deadline = started + lease
        # extend() against a renewal on its way (see renew): both change the
        # lease, from two threads, on two connections.
        self.lease_lock = threading.Lock()
        self.lease_generation = 0
        #: The lease a renewal on its way carries (``None``: none is).
        self.renewing_lease: float | None = None
        #: The extend script (its spec's ``token`` and ``lease_ms``) and its KEYS.
        self.renew_script = renew_script
        self.renew_keys = renew_keys
        #: The release script's KEYS.
        self.keys = keys
        self.sigprefix = sigprefix
        self._begin()

    def _begin(self) -> None:
        """The state every holding starts in, whatever it holds."""
        #: ``batch_slot``'s, once known (-1: not yet).
        self.slot: int | None = -1
        #: What the primitive's release script takes besides the keys, when
        #: it is the same for every release of this holding.
        self.release_args: list[Any] = []
        self.active = True
        self.releasing = False
        #: Handed off by ``detach()``: over for this holder, not released.
        self.detached = False
        self.lost: str | None = None
        #: The watchdog's (``holds/watchdog.py``): whether it renews this hold.
        self.watch_state = 0
        #: What the holder asked to be told of a loss (``holds/losses.py``), if anything.
        self.hooks: LossHooks | None = None

    @property
    def renew_interval(self) -> float:
        """A third of the lease: the watchdog renews two more times before it ends."""
        return self.lease / 3

    @property
    def lane(self) -> Hashable:
        """The watchdog renews the leases held through one connection pool one
        at a time, beside those held elsewhere (see ``watchdog``): a client's
        pool, or on Redis Cluster the node that serves the lease's slot."""
        client = self.client
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            return id(pool)
        node_of = getattr(client, "get_node_from_key", None)  # RedisCluster
        if node_of is not None:
            try:
                return (id(client), node_of(self.renew_keys[0]).name)
            except Exception:  # no slot map at hand: the cluster's one lane
                logger.debug("No node for %r's lane", self.name, exc_info=True)
        return id(client)

    def renew_call(self, lease: float) -> tuple[Sequence[str | bytes], list[Any]]:
        """KEYS and ARGV of the extend script making ``lease`` the lease from now on."""
        return self.renew_keys, self.renew_script.args_of(
            token=self.token, lease_ms=int(lease * 1000)
        )

    @property
    def batch_client(self) -> Any:
        """The client whose script calls carry this renewal with others of the
        same client (``holds/renewals.py``): one whose commands all go over one
        connection pool, or a Redis Cluster client (a call then carries the
        renewals of one hash slot, ``batch_slot``). ``None`` for a holding
        whose class sends its lease its own way (``send_lease``, ``renew``),
        renewed alone (``renew``)."""
        client = self.client
        cls = type(self)
        if cls.send_lease is not Holding.send_lease or cls.renew is not Holding.renew:
            return None
        if getattr(client, "connection_pool", None) is None and self.batch_slot is None:
            return None
        return client

    @property
    def batch_slot(self) -> int | None:
        """The Redis Cluster hash slot of the renewed key, worked out once;
        ``None`` on a client that is not a cluster's."""
        slot = self.slot
        if slot == -1:
            keyslot = getattr(self.client, "keyslot", None)  # RedisCluster
            slot = self.slot = None if keyslot is None else keyslot(self.renew_keys[0])
        return slot

    def renew(self) -> bool:
        """The watchdog's renewal, sent alone; ``False`` if the lease is no
        longer ours. A batch (``holds/renewals.py``) follows the same rules,
        ``renewal_started`` and ``renewal_ended``. An ``extend()`` to another
        lease can cross a renewal on its way (another thread, another
        connection): if the renewal reached Redis second, it put back the
        lease it had read before. So a renewal that finds the lease changed
        under it sends the new one once more. Crossed again
        (``RENEWAL_SENDS``), it leaves the deadline where the extends put it
        (the earlier end), by which the watchdog comes back soon: one holder's
        extends never keep the thread from the others' leases."""
        for _ in range(RENEWAL_SENDS):
            begun = self.renewal_started()
            if begun is None:
                return True
            lease, generation = begun
            started = time.monotonic()
            try:
                ours = self.send_lease(lease)
            except BaseException:
                self.renewal_ended(lease, generation, started, None)
                raise
            outcome = self.renewal_ended(lease, generation, started, ours)
            if outcome is not None:
                return outcome
        return True

    def renewal_started(self) -> tuple[float, int] | None:
        """A renewal about to be sent: the lease it carries, marked as on its
        way (``renewing_lease``, which an ``extend()`` reads), and the lease's
        generation then; ``None`` when the hold is over (nothing to renew)."""
        if not self.active:
            return None
        with self.lease_lock:
            lease = self.renewing_lease = self.lease
            return lease, self.lease_generation

    def renewal_ended(
        self, lease: float, generation: int, started: float, ours: bool | None
    ) -> bool | None:
        """A renewal of ``lease`` sent at ``started`` was answered: ``ours``
        whether the lease is still ours (``None``: an error, its sender's to
        raise). Its outcome (``True`` renewed, ``False`` lost), or ``None``:
        send again (an ``extend()`` crossed it) or no answer."""
        with self.lease_lock:
            self.renewing_lease = None
            if ours and generation == self.lease_generation:
                self.lease_deadline = self.deadline_of(started, lease)
                return True
        if not ours and ours is not None:
            # A release sent while this renewal was on its way may have run
            # first on the server: then "not ours" is the release, not a
            # loss; the release's own answer decides.
            return self.releasing
        return None

    def send_lease(self, lease: float) -> bool:
        """Make ``lease`` the lease in Redis from now on; ``False`` if not ours."""
        with backend.translate_errors(self.name):
            return bool(pool.send(self.renew_script, self.client, *self.renew_call(lease)))

    def deadline_of(self, started: float, lease: float) -> float:
        """The lease's end as this holder measures it, never later than Redis's."""
        return started + lease

    def begin_extend(self, lease: float, started: float) -> bool:
        """``extend()``, about to be sent at ``started``: ``lease`` is the lease
        from now on, for every renewal sent after this too, and the deadline is
        no later than its end until the extend is answered. ``True`` when a
        renewal with another lease is on its way: Redis may run it last."""
        deadline = self.deadline_of(started, lease)
        with self.lease_lock:
            self.lease_deadline = min(self.lease_deadline, deadline)
            if lease != self.lease:
                self.lease_generation += 1
                self.lease = lease
            return self.renewing_lease not in (None, lease)

    @contextlib.contextmanager
    def extending(self, lease: float) -> Iterator[Callable[[], None]]:
        """Around sending an ``extend()`` to ``lease`` (every primitive's):
        call what it yields once Redis answered that the lease is ours. If the
        block raises instead, Redis may or may not have run it."""
        started = time.monotonic()
        overlapped = self.begin_extend(lease, started)
        try:
            yield functools.partial(self.end_extend, lease, started, sure=not overlapped)
        except BaseException:
            self.end_extend(lease, started, sure=False)
            raise

    def end_extend(self, lease: float, started: float, *, sure: bool) -> None:
        """After ``extend()`` was sent at ``started``: unless ``sure`` it
        succeeded and ran last in Redis (it failed, or a renewal with the old
        lease was on its way, until that renewal sends again), the deadline
        stays the earlier of the old and the new lease's ends."""
        if sure:
            deadline = self.deadline_of(started, lease)
            with self.lease_lock:
                self.lease_deadline = deadline
        if self.active:
            watchdog.reschedule(self)

    def mark_lost(self, reason: str) -> None:
        """Report the loss, once: a renewal's lane and the watchdog's report
        of it overdue can find it at the same moment."""
        with self.lease_lock:
            if not self.active or self.lost is not None:
                return
            self.lost = reason
        # A logging handler that raises must not keep the holder from being
        # told. Logged in full, or summarised with others lost meanwhile.
        with contextlib.suppress(Exception):
            watchdog.report_lost(
                self.kind, self.name, self.holder, time.monotonic() - self.acquired_at, reason
            )
        hooks = self.hooks  # first: the holder hears of it at once
        if hooks is not None:
            try:
                hooks.fire(self, reason)
            except Exception:  # the watchdog's lane, or the holder's release, goes on
                logger.exception("Telling the holder of %r of its loss failed", self.name)
        self._count_lost()
        signals.notify(
            signals.lock_lost,
            sender=self.sender,
            name=self.name,
            kind=self.kind,
            held=time.monotonic() - self.acquired_at,
            reason=reason,
        )

    def lapsed(self, sent: float, action: str) -> bool:
        """Whether a release or extend sent at ``sent`` (``time.monotonic()``)
        that Redis did not answer leaves this hold certainly lost: reported
        lost already (the watchdog, an earlier call), or its lease had ended
        by this holder's own clock before it was sent. The lease is measured
        from before the acquire (or the last renewal) was sent, so it ends
        no later than Redis's: another holder may have been let in while
        this one's section still ran, and the holder must hear of it
        (``LockLostError``, ``lock_lost`` once) rather than of an
        unreachable Redis alone. A call sent in time that went unanswered
        proves nothing either way: the section ended before its lease did.
        Reported here, so before ``end()``."""
        if self.lost is None and sent >= self.lease_deadline:
            self.mark_lost(
                f"its lease had ended before the holder {action}, "
                "and Redis could not be reached to tell"
            )
        return self.lost is not None

    def _count_lost(self) -> None:
        """Tallied and written in the background (``counters``): often the
        lease was lost because its server hangs, and the reports of the other
        leases held there must not wait on a round trip to it."""
        counters.lost(self.client, self.stats_key, self.stats_ttl_ms, self.name)

    def end(self) -> None:
        """Stop renewing; the holding is over, however it ended."""
        self.active = False
        watchdog.unwatch(self)

    def __del__(self) -> None:
        """Every handle that took this hold was dropped without a release
        (``Lock("x").acquire()`` on an object nobody keeps, a thread or task
        that ended holding) while the watchdog renewed it: nothing renews or
        releases it now, and the lease will free the name with no
        ``lock_lost`` to tell anyone. Only queued here (``holds/dropped.py``); a
        released hold is no longer watched, and a lost one was reported."""
        if not self.active:  # released, or lost: nothing renews it
            return
        try:
            if self.lost is None and self.pid == current_pid() and not sys.is_finalizing():
                watchdog.dropped(self, (self.kind, self.name, self.holder, self.lease_deadline))
        except Exception:  # interpreter shutdown: the module's globals may be gone
            pass
