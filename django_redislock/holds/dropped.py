"""Reports of holds dropped without a release, made where logging is safe;
and of leases lost, summarised when many are lost together (``Summary``,
the one summariser core: the lock-outage log, ``outages.py``, and the
watchdog's retry line, ``settling.py``, use it too).

A hold whose every handle was dropped while the watchdog renewed it
(``Lock("x").acquire()`` on an object nobody keeps, a thread or task that
ended holding) is freed by the collector, which runs wherever it happens to
run: in a dying thread (where logging makes ``threading`` invent a dummy
thread), or inside a logging handler holding its own lock. So
``Holding.__del__`` only queues (``SimpleQueue.put`` takes no lock and is
reentrant), and the watchdog logs the queue before it watches an acquire and
from its scheduler between passes.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

logger = logging.getLogger("django_redislock.watchdog")

#: kind, name, holder, lease end (``time.monotonic``)
Report = tuple[str, str, str, float]


class DroppedHolds:
    """The queue of one process's reports (the watchdog's: a forked child starts empty)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Report] = queue.SimpleQueue()

    def put(self, report: Report) -> None:
        """Queue a report whose lease is not over yet; safe in ``__del__``."""
        if report[3] > time.monotonic():
            self._queue.put(report)

    def pending(self) -> bool:
        return not self._queue.empty()

    def report(self) -> None:
        """Log the queued reports, once each."""
        while True:
            try:
                kind, name, holder, deadline = self._queue.get_nowait()
            except queue.Empty:
                return
            logger.warning(
                "%s %r held by %s was dropped without a release: it is renewed no more, "
                "and its lease frees it within %.1f s. Keep the object until release(), "
                "or use `with`.",
                kind,
                name,
                holder,
                max(deadline - time.monotonic(), 0.0),
            )


K = TypeVar("K", bound=Hashable)


class Summary(Generic[K]):
    """Events of one kind between two log lines: the first after a quiet
    ``interval`` logged in full (``quiet``), those after it counted until a
    line reports them (``take``). Counted per key for the first ``kept``
    distinct keys (the rest only in ``count``: an outage hitting a million
    names must not keep a million entries) and the first ``sample`` items.
    Not thread-safe: its owner's lock guards it."""

    __slots__ = ("count", "interval", "items", "kept", "keys", "last_line", "sample")

    def __init__(self, interval: float, *, kept: int = 0, sample: int = 0) -> None:
        self.interval = interval
        self.kept = kept
        self.sample = sample
        #: When the last line was written (``time.monotonic``, or its owner's clock).
        self.last_line = -math.inf
        self.count = 0
        self.keys: Counter[K] = Counter()
        self.items: list[Any] = []

    def quiet(self, now: float) -> bool:
        """Whether an event ``now`` comes after a quiet interval: nothing
        counted, the last line ``interval`` ago. Then it is logged in full,
        and the next interval starts."""
        if self.count or now < self.last_line + self.interval:
            return False
        self.last_line = now
        return True

    def add(self, key: K | None = None, item: Any = None) -> None:
        """Count one event, for the next line."""
        self.count += 1
        keys = self.keys
        if key is not None and (key in keys or len(keys) < self.kept):
            keys[key] += 1
        if item is not None and len(self.items) < self.sample:
            self.items.append(item)

    def due(self) -> float:
        """When a line of what was counted is due (``inf``: nothing is)."""
        return self.last_line + self.interval if self.count else math.inf

    def take(self, now: float) -> tuple[int, Counter[K], list[Any]]:
        """What was counted (count, per key, sample), for a line written ``now``."""
        taken = self.count, self.keys, self.items
        self.count, self.keys, self.items = 0, Counter(), []
        self.last_line = now
        return taken


#: A first loss is logged at once, in full; those that follow within this
#: many seconds are summarised in one line at its end (``LostLeases``).
LOSS_INTERVAL = 5.0
#: How many names a summary line shows.
LOSS_SAMPLE = 5


class LostLeases:
    """The log of lost leases, one line per ``LOSS_INTERVAL`` at most.

    A process that falls behind its renewals, or whose Redis went away,
    loses thousands of leases within a second or two: one WARNING each
    flooded the log (16,532 lines for one stall) and cost the watchdog time
    when it could least spare it. Each holder is still told, each on its
    own (``lock_lost``, ``LockLostError`` at its release); only the log is
    summarised. A loss after a quiet interval is logged at once, in full;
    the ones that follow it within the interval are counted, and ``flush``
    (the watchdog's scheduler, at ``due()``) logs them in one line: the
    count, a sample of names and the count per reason.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        # per reason (every reason a burst has: a handful), and a sample of names
        self._summary: Summary[str] = Summary(LOSS_INTERVAL, kept=1_000, sample=LOSS_SAMPLE)

    def report(self, kind: str, name: str, holder: str, held: float, reason: str) -> bool:
        """Log one loss, or count it for the summary; ``True`` when counted
        (then ``flush`` must run at ``due()``)."""
        now = time.monotonic()
        with self._lock:
            counted = not self._summary.quiet(now)
            if counted:
                self._summary.add(reason.split(": ", 1)[0], f"{kind} {name!r}")
        if not counted:
            self._logger.warning(
                "Lost the lease of %s %r held by %s for %.3f s: %s",
                kind,
                name,
                holder,
                held,
                reason,
            )
        return counted

    def due(self) -> float:
        """When ``flush`` has a summary to log (``inf``: none is waiting)."""
        return self._summary.due()

    def flush(self, *, force: bool = False) -> None:
        """Log the summary of the losses counted, once its interval is over
        (or now, ``force``: the watchdog's thread is about to exit)."""
        now = time.monotonic()
        with self._lock:
            if not self._summary.count or (now < self._summary.due() and not force):
                return
            count, reasons, sample = self._summary.take(now)
        more = f" and {count - len(sample):,} more" if count > len(sample) else ""
        self._logger.warning(
            "Lost the leases of %s more holds in the last %g s (%s%s): %s. Each holder "
            "is told (lock_lost, LockLostError at its release).",
            f"{count:,}",
            LOSS_INTERVAL,
            ", ".join(sample),
            more,
            "; ".join(f"{reason} ({n:,})" for reason, n in reasons.most_common()),
        )
