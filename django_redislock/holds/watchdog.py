"""One watchdog per process for every auto-renewed lease.

Its scheduler thread is started by the first ``watch`` and exits after it has
had nothing to renew for ``IDLE_EXIT`` seconds, so a hot acquire/release loop
never starts a thread per acquire, and an idle process keeps no thread. It
holds only weak references: a holding whose primitive was dropped without
release stops being renewed and its lease runs out, as if its process had died
(and is reported: ``dropped``).

The scheduler decides when a lease is due; the renewal itself is sent from a
lane, one thread per connection pool the leases are held on (``holds/lanes.py``),
so a server that hangs stalls only the renewals of the leases held on it; the
renewals waiting in a lane go in one script call per batch
(``holds/renewals.py``), and are settled by ``holds/settling.py``.

A renewal that finds the lease no longer ours, or cannot reach Redis before
the lease would have ended, marks the holding lost and sends ``lock_lost``; so
does one still unanswered when the lease ends as the holder measures it (a
server that hangs, a connection without a socket timeout).
A failed renewal is retried only while another attempt, up to twice as slow
and half a retry delay late, would still end before the lease does: the
holder is told no later than its lease end (as it measures it, never later
than Redis's), with or without a socket timeout; with none, the renewal's
lane (never the others) stays blocked until the OS gives up on the connection.

Due renewals are kept in a heap, so a pass costs the renewals it sends,
never a scan of every lease (with 20,000 leases, scans took more of the
thread than the renewals). How late the renewals run is watched
(``holds/lag.py``): the process warns before it loses leases. Leases lost
together are logged in one line per interval (``holds/dropped.py``), each
holder still told.

After ``fork()`` the child starts with an empty watchdog: it never renews (or
releases) what its parent holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Hashable

from django_redislock.engine.threads import Lifecycle
from django_redislock.exceptions import LockError
from django_redislock.holds.dropped import DroppedHolds, LostLeases, Report
from django_redislock.holds.lag import Lag
from django_redislock.holds.lanes import Lanes, _Job
from django_redislock.holds.renewals import Renewable
from django_redislock.holds.schedule import RENEW, Entry, Schedule
from django_redislock.holds.settling import RETRY_DELAY, Settling, _due

logger = logging.getLogger(__name__)

#: Seconds the scheduler's thread, or a lane's, lingers with nothing to do
#: before it exits.
IDLE_EXIT = 5.0
#: The scheduler's thread name (the lanes': ``holds/lanes.py``).
SCHEDULER_THREAD = "django-redislock-watchdog"
#: The most renewals a pass hands to the lanes, so a backlog never keeps the
#: watchdog's lock (which every acquire takes) for long.
PASS_LIMIT = 4096
#: New holds waiting to be scheduled (``watch``) before the acquire that finds
#: this many admits them itself: the queue of a hot loop stays small (a few
#: kilobytes, freed before the garbage collector would look at it).
ADMIT_BATCH = 64

#: ``Holding.watch_state``: not watched; queued for admission (``watch``);
#: scheduled, or found released when admitted (``_admit``).
UNWATCHED, ARRIVED, SCHEDULED = 0, 1, 2


class Watchdog:
    """The scheduler: what is watched and when it is due. What is sent, and
    what follows, are its parts: ``lanes`` (``holds/lanes.py``) and
    ``settling`` (``holds/settling.py``), each given what it shares."""

    def __init__(self) -> None:
        self._life = Lifecycle(SCHEDULER_THREAD, self._reset)
        self._reset()

    def _reset(self) -> None:
        """Empty, with no thread: new, or a forked child's (which must never
        renew or release what its parent holds)."""
        # watch/unwatch (twice per acquire) take the bare lock: Condition's own
        # __enter__ is Python code.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._schedule = Schedule()
        self._watched = self._schedule.watched  # by id(holding)
        #: Holds ``watch`` queued, weakly, for the scheduler to admit (``_admit``).
        self._arrivals: deque[tuple[weakref.ref[Renewable], float]] = deque()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        self._dropped = DroppedHolds()
        self.losses = LostLeases(logging.getLogger("django_redislock.holds.holding"))
        self.lagging = Lag(type(self), self._census)
        self.lanes = Lanes(self._lock, self._life, self._idle_exit)
        self.settling = Settling(self.renewed, self.unwatch, self.lagging)

    def _forked(self) -> None:
        """Reset in a child forked without the fork hooks (``os.fork`` from C,
        as uWSGI does without ``py-call-osafterfork``), before taking a lock
        a parent's thread may have held: the parent's thread is not here."""
        self._life.forked()

    def ensure_running(self, pid: int | None = None) -> None:
        """Start the thread before an acquire that will need it.

        A process that cannot start a thread (its thread, pid or memory limit
        reached) then fails the acquire with ``LockError`` before Redis grants
        anything, instead of holding a lease nothing renews. ``pid``: this
        process's, when the caller has just asked.
        """
        if self._thread is not None and self._life.pid == (pid or os.getpid()):  # the common case
            return
        self._forked()
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._start()

    def _start(self) -> None:
        """Start the thread (``_lock`` held); left unset if it cannot start,
        so the next acquire tries again."""
        thread = self._life.start(self._run)
        if thread is None:
            raise LockError("could not start the thread that renews leases (see the log)")
        self._thread = thread

    def watch(self, holding: Renewable) -> None:
        """Renew ``holding`` from now on; its acquire called
        ``ensure_running`` first (which also notices a fork). Should the
        thread (gone idle since) fail to start again, the holding is reported
        lost at once: a lease nothing renews must not lapse unannounced.

        Most holds are released long before their first renewal, a third of
        the way into the lease, so a new hold is only queued (a ``deque``
        append, no lock) and the scheduler admits it when it next looks
        (``_admit``): it wakes for it only when it would otherwise look too
        late. The scheduler sets ``_wake_at`` before it checks the queue and
        sleeps, and this reads it after queueing: one of the two sees the other."""
        if self._dropped.pending():
            self._dropped.report()
        holding.watch_state = ARRIVED
        due = _due(holding, time.monotonic())
        arrivals = self._arrivals
        arrivals.append((weakref.ref(holding), due))
        if due >= self._wake_at and self._thread is not None and len(arrivals) < ADMIT_BATCH:
            return
        with self._lock:
            self._admit()
            if self._thread is not None:
                if due < self._wake_at:
                    self._cond.notify()
                return
            try:
                self._start()
                return
            except LockError as exc:
                self._schedule.remove(id(holding))
                failure = exc
        holding.mark_lost(str(failure))

    def _admit(self) -> None:
        """(Under the lock.) Schedule the queued holds still held; a released
        one is dropped. A hold is marked scheduled before it is looked at,
        and its release marks it inactive before it looks at the mark
        (``unwatch``): one of the two sees the other."""
        arrivals = self._arrivals
        while arrivals:
            ref, due = arrivals.popleft()
            holding = ref()
            if holding is None:
                continue
            holding.watch_state = SCHEDULED
            if holding.active:
                self._schedule.add(Entry(holding, due))

    def report_lost(self, kind: str, name: str, holder: str, held: float, reason: str) -> None:
        """Log a lost lease (``Holding.mark_lost``), summarised with others
        lost at about the same time (``LostLeases``)."""
        if self.losses.report(kind, name, holder, held, reason):
            self._forked()
            with self._lock:
                if self._thread is None:
                    with contextlib.suppress(LockError):  # logged at the next report then
                        self._start()
                elif self.losses.due() < self._wake_at:
                    self._cond.notify()

    def dropped(self, holding: Renewable, report: Report) -> None:
        """``holding`` is being freed (``Holding.__del__``): if it was still
        renewed here, queue its report (``holds/dropped.py``; takes no lock)."""
        if holding.active and (holding.watch_state == ARRIVED or id(holding) in self._watched):
            self._dropped.put(report)

    def reschedule(self, holding: Renewable) -> None:
        """The lease changed (``extend``): renew by the new one, if watched.
        A renewal on its way schedules the next itself; the scheduler looks
        again at when that one is overdue (the lease end may have moved)."""
        due = _due(holding, time.monotonic())
        with self._lock:
            self._admit()
            entry = self._watched.get(id(holding))
            if entry is None or entry.ref() is not holding:
                return
            if entry.sent:  # look again at when it is overdue
                due = holding.lease_deadline
            else:
                entry.due = due
            self._schedule.push(entry, due)
            if due < self._wake_at:
                self._cond.notify()

    def unwatch(self, holding: Renewable) -> None:
        """Renew ``holding`` no more. A released hold still queued costs no
        lock: the scheduler drops it when it admits it (``_admit``). The last
        scheduled hold's release wakes the scheduler, which waits for that
        hold's next renewal (a long lease's is minutes away): its idle
        countdown (``IDLE_EXIT``) starts now."""
        if holding.watch_state != SCHEDULED and not holding.active:
            return  # queued (the scheduler drops it), or never watched
        with self._lock:
            self._admit()
            self._schedule.remove(id(holding))
            if not self._watched and self._thread is not None:
                self._cond.notify()

    def watching(self) -> int:
        """How many holdings are renewed (a dropped one no more, even before the next pass)."""
        with self._lock:
            self._admit()
            return sum(1 for entry in self._watched.values() if entry.ref() is not None)

    def lag(self) -> float:
        """Seconds the oldest renewal due is late now: waiting in a lane, for
        the scheduler, or in the last batch sent (0 when none is late)."""
        now = time.monotonic()
        with self._lock:
            self._admit()
            oldest = self.lanes.oldest_due()
            due = self._schedule.oldest_due()
        if due is not None:
            oldest.append(due)
        return max(self.lagging.last, now - min(oldest, default=now), 0.0)

    def _census(self) -> tuple[int, int, float]:
        """Holds whose renewal is overdue, holds renewed, renewals owed a
        second; scans every hold (``Lag`` asks only when its state changes)."""
        now = time.monotonic()
        with self._lock:
            self._admit()
            return self._schedule.census(now)

    def _idle_exit(self) -> float:
        """``IDLE_EXIT`` for a lane (``Lanes``): one setting for both kinds of
        thread, read each time one waits."""
        return IDLE_EXIT

    def renewed(self, renewed: list[tuple[Renewable, float]]) -> None:
        """After renewals (from their lane, ``Settling``): each one's next is
        due when given."""
        if not renewed:
            return
        with self._cond:
            earliest = self._schedule.renewed(renewed)
            if earliest < self._wake_at:
                self._cond.notify()

    def _run(self) -> None:
        """The scheduler's passes, until idle for ``IDLE_EXIT``. One that raises
        (a logging handler's error) is logged and the next goes on: the thread
        ended, still registered, and every lease lapsed untold."""
        idle_since: list[float] = []  # when it last found nothing to renew
        while True:
            try:
                if not self._pass(idle_since):
                    return
            except Exception:
                with contextlib.suppress(Exception):  # that handler may raise again
                    logger.exception("The watchdog's pass failed; going on")
                time.sleep(RETRY_DELAY)  # never a busy loop, should it fail again

    def _pass(self, idle_since: list[float]) -> bool:
        """Report dropped holds and losses, then send what is due or wait for
        it; ``False`` once idle (the thread unregistered). Its frame ends
        before the next pass: the thread keeps no job, no holding, alive
        between passes (a dropped hold would be renewed for ever instead of
        running out)."""
        if self._dropped.pending():  # outside the lock; rare: a misuse
            self._dropped.report()
        self.losses.flush()
        with self._cond:
            self._admit()
            now = time.monotonic()
            if self._watched:
                idle_since.clear()
                due: dict[Hashable, list[_Job]] | None = self._due_or_wait(now)
            elif self._idle(idle_since, now):
                return True
            else:
                due = None
        if due is None:  # the thread is unregistered
            self.losses.flush(force=True)  # nobody else would log them
            return False
        for lane, jobs in due.items():
            self.lanes.dispatch(lane, jobs)
        return True

    def _idle(self, idle_since: list[float], now: float) -> bool:
        """(Under ``_cond``.) Nothing to renew: wait for work, a summary of
        losses to log, or ``IDLE_EXIT``; ``False`` once idle that long (the
        thread unregistered)."""
        idle_since[:] = idle_since or [now]
        if now - idle_since[0] < IDLE_EXIT:
            self._wake_at = min(idle_since[0] + IDLE_EXIT, self.losses.due())
            if not self._arrivals:  # one queued since the pass began: admit it first
                self._cond.wait(max(self._wake_at - now, 0.0))
            return True
        self._thread = None
        self._wake_at = float("inf")
        if self._arrivals:  # queued by a watch that saw this thread still there
            self._thread = threading.current_thread()
            return True
        return False

    def _due_or_wait(self, now: float) -> dict[Hashable, list[_Job]]:
        """The jobs due (renewals, and reports of renewals overdue), per lane;
        if none is, wait (under ``_cond``) until the earliest is."""
        due_now, earliest = self._take_due(now)
        if not due_now:
            self._wake_at = min(earliest, self.losses.due())
            if self._wake_at != float("inf") and not self._arrivals:  # as in _idle
                self._cond.wait(max(self._wake_at - now, 0.0))
        return due_now

    def _take_due(self, now: float) -> tuple[dict[Hashable, list[_Job]], float]:
        """Each lease due now, as a job for its lane (``PASS_LIMIT`` at most),
        and when the next is due. A renewal still on its way when the lease
        ends (as the holder measures it) is overdue: its report goes to a lane
        of its own, since the renewal's lane may be stuck on the same server.
        Jobs hold holdings weakly (see ``_run``): one dropped while another's
        renewal waits on Redis is not renewed again."""
        found, earliest = self._schedule.take(now, PASS_LIMIT, RETRY_DELAY)
        due_now: dict[Hashable, list[_Job]] = {}
        renew, overdue = self.settling.renew, self.settling.overdue
        for kind, entry, lane in found:
            if kind == RENEW:
                due_now.setdefault(lane, []).append((renew, entry))
            else:
                due_now.setdefault(("overdue", lane), []).append((overdue, entry))
        return due_now, earliest


watchdog = Watchdog()
