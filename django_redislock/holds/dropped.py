"""Reports of holds dropped without a release, made where logging is safe.

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
import time

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
