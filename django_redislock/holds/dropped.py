"""Reports of holds dropped without a release, made where logging is safe;
and of leases lost, summarised when many are lost together.

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
import queue
import threading
import time
from collections import Counter

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
        self._quiet_from = 0.0  # (time.monotonic) a loss from then on is logged at once
        self._count = 0
        self._sample: list[str] = []
        self._reasons: Counter[str] = Counter()

    def report(self, kind: str, name: str, holder: str, held: float, reason: str) -> bool:
        """Log one loss, or count it for the summary; ``True`` when counted
        (then ``flush`` must run at ``due()``)."""
        now = time.monotonic()
        with self._lock:
            counted = self._count > 0 or now < self._quiet_from
            if counted:
                self._count += 1
                if len(self._sample) < LOSS_SAMPLE:
                    self._sample.append(f"{kind} {name!r}")
                self._reasons[reason.split(": ", 1)[0]] += 1
            else:
                self._quiet_from = now + LOSS_INTERVAL
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
        return self._quiet_from if self._count else float("inf")

    def flush(self, *, force: bool = False) -> None:
        """Log the summary of the losses counted, once its interval is over
        (or now, ``force``: the watchdog's thread is about to exit)."""
        now = time.monotonic()
        with self._lock:
            if not self._count or (now < self._quiet_from and not force):
                return
            count, sample, reasons = self._count, self._sample, self._reasons
            self._count, self._sample, self._reasons = 0, [], Counter()
            self._quiet_from = now + LOSS_INTERVAL
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
