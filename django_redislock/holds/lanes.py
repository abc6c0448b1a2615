"""The watchdog's lanes: one thread per connection pool the leases are held on
(``Renewable.lane``: a cache alias's server, a Redlock's set of servers), each
sending, in order, the renewals the scheduler hands it.

With one thread renewing in turn, a renewal stuck on one server until its
socket timeout left every other lease of the process unrenewed, and they
lapsed: now a server that hangs stalls the renewals of the leases held on it,
never those held elsewhere. A lane exits after ``IDLE_EXIT`` seconds without
work, so an idle process keeps no thread; one that cannot start is not fatal:
its renewals are sent from the scheduler's thread. What a lane does with a
batch is ``holds/settling.py``'s.

``Lanes`` is a part of ``Watchdog`` (``holds/watchdog.py``), given what it
shares with it when made: the watchdog's lock (a lane's jobs are queued
under it), the lifecycle that starts the threads, and how long a lane
lingers idle. It owns the lanes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable

from django_redislock.engine.threads import Lifecycle
from django_redislock.holds.renewals import take_batch
from django_redislock.holds.schedule import Entry
from django_redislock.holds.settling import _batch_limit

# The watchdog's logger, as before the lanes had a module of their own.
logger = logging.getLogger("django_redislock.holds.watchdog")

#: The lanes' thread name.
LANE_THREAD = "django-redislock-renewal"

#: One lane's work: a holding's renewal, or the report of one that never came
#: back, as the function that takes the entries of such jobs, and the entry.
_Work = Callable[[list[Entry]], None]
_Job = tuple[_Work, Entry]


class _Lane:
    """One lane's jobs, waiting for its thread (under the watchdog's lock)."""

    __slots__ = ("jobs", "ready")

    def __init__(self, lock: threading.Lock) -> None:
        self.jobs: deque[_Job] = deque()
        self.ready = threading.Condition(lock)


class Lanes:
    """The sending side of ``Watchdog``: its jobs, run in their lanes.

    ``idle_exit()``: seconds a lane's thread lingers without work before it
    exits, read each time one waits."""

    def __init__(
        self, lock: threading.Lock, life: Lifecycle, idle_exit: Callable[[], float]
    ) -> None:
        self._lock = lock
        self._life = life
        self._idle_exit = idle_exit
        self._lanes: dict[Hashable, _Lane] = {}

    def oldest_due(self) -> list[float]:
        """(Under the lock.) When the first job waiting in each lane was due."""
        return [queue.jobs[0][1].due for queue in self._lanes.values() if queue.jobs]

    def dispatch(self, lane: Hashable, jobs: list[_Job]) -> None:
        """Run ``jobs`` in ``lane``'s thread, after that lane's earlier jobs and
        beside other lanes'; here, when no thread can start for it."""
        with self._lock:
            queue = self._lanes.get(lane)
            if queue is None:
                queue = _Lane(self._lock)
                if self._life.start(self._serve, lane, queue, name=LANE_THREAD) is None:
                    queue = None  # renewed in the watchdog's own thread, below
                else:
                    self._lanes[lane] = queue
            if queue is not None:
                queue.jobs.extend(jobs)
                queue.ready.notify()
                return
        left = deque(jobs)
        while left:
            work, entries = take_batch(left, _batch_limit())
            try:
                work(entries)
            except BaseException as exc:  # SystemExit from a receiver: the scheduler must go on
                logger.warning("A lease renewal stopped: %r", exc)

    def _serve(self, lane: Hashable, queue: _Lane) -> None:
        """A lane's thread: its jobs in order, until idle for ``_idle_exit()``;
        those of one kind waiting together at once (``take_batch``)."""
        try:
            while True:
                with self._lock:
                    if not queue.jobs:
                        queue.ready.wait(self._idle_exit())
                        if not queue.jobs:
                            return
                    work, entries = take_batch(queue.jobs, _batch_limit())
                try:
                    work(entries)
                except Exception:  # a lane must survive anything, as the scheduler does
                    logger.exception("Lease renewal crashed")
                except BaseException as exc:  # SystemExit from a lock_lost receiver
                    logger.warning("A lease renewal thread stopped: %r", exc)
                    return  # what it does to a thread; the jobs left go to a new one
                entries = []  # this frame idles next: it keeps no job's references
        finally:
            self._leave(lane, queue)

    def _leave(self, lane: Hashable, queue: _Lane) -> None:
        """A lane's thread ends (idle, or killed by ``SystemExit`` from a
        ``lock_lost`` receiver): the next job starts a new one, and jobs left
        in its queue go there."""
        with self._lock:
            if self._lanes.get(lane) is queue:
                del self._lanes[lane]
            left = list(queue.jobs)
            queue.jobs.clear()
        if left:
            self.dispatch(lane, left)
