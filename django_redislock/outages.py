"""Logging a lock-service outage once, then in summary.

While Redis is down every request to a ``@require_lock`` view fails the same
way. One ERROR record with a chained traceback per request came to about
50,000 lines (2.9 MB) for an 8-second outage at 75 requests/s: error
trackers drown and the cause scrolls away. So an :class:`OutageLog` logs the
first failure of an outage with its traceback, then at most one line per
``interval`` with the count of failures since the last line and the names
and views they hit (the busiest few), and one line when Redis answers again.

There is no timer: a summary is written by the first failure after its
interval has ended, and what is still unsummarised when Redis answers again
is in the recovery line. A process that sees no more traffic writes nothing
more, and no test depends on when a background thread runs.

One object per process (``responses.outage_log()``, a cached accessor that is
cleared in a forked child: the parent's outage is not the child's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django_redislock.exceptions import LockBackendError
from django_redislock.holds.dropped import Summary

#: Seconds between two summary lines of one outage.
SUMMARY_INTERVAL = 10.0

#: How many (name, view) pairs a summary line names; the rest are counted.
SHOWN = 3

#: How many distinct (name, view) pairs one interval keeps counts for; later
#: ones are counted only in the total, "elsewhere" (an outage hitting a million names must not
#: grow memory by a million entries).
KEPT = 100

#: A record to write once the mutex is released: level, message, args, exc_info
#: (a slow handler, an error tracker sending over the network, must not hold up
#: the other failing calls).
_Line = tuple[int, str, tuple[object, ...], Any]


class OutageLog:
    """Logs failures of the lock service: the first in full, then summaries.

    ``failure()`` for each failed call, ``answered()`` for each call that got
    an answer from Redis; thread-safe. ``clock`` is injectable so tests
    control time without sleeping.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = SUMMARY_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}.")
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._mutex = threading.Lock()
        #: When the current outage began (``None``: Redis answers).
        self._since: float | None = None
        #: The failures since the last line of this outage, per (name, view).
        self._pending: Summary[tuple[str, str]] = Summary(interval, kept=KEPT)
        #: When a traceback was last logged: a new outage soon after (Redis
        #: flapping) is logged without one.
        self._last_traceback: float | None = None
        self._total = 0
        self._last_error: LockBackendError | None = None

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failure(self, error: LockBackendError, where: str, message: str, *args: object) -> None:
        """One call failed with ``error`` at ``where`` (``"POST /buy/1/"``).

        The first failure of an outage is logged at ERROR as ``message % args``
        with its traceback; later ones are counted for the next summary line.
        """
        now = self.clock()
        line: _Line | None = None
        with self._mutex:
            if self._since is None:
                line = self._begin(now, error, message, args)
            else:
                if now >= self._pending.due():
                    line = self._summarise(now)
                self._count(error, where)
        self._write(line)

    def answered(self) -> None:
        """A call got an answer from Redis: an outage, if one was going, is over."""
        if self._since is None:  # the common case: no lock taken
            return
        now = self.clock()
        with self._mutex:
            if self._since is None:
                return
            count = self._pending.take(now)[0]
            pending = f" ({count} since the last line)" if count else ""
            line: _Line = (
                logging.WARNING,
                "Redis answers lock requests again after %.1f s of failures: "
                "%d failed call(s) in all%s.",
                (now - self._since, self._total, pending),
                None,
            )
            self._since = None
            self._total = 0
            self._last_error = None
        self._write(line)

    def _write(self, line: _Line | None) -> None:
        if line is not None:
            level, message, args, exc_info = line
            self.logger.log(level, message, *args, exc_info=exc_info)

    def _begin(
        self, now: float, error: LockBackendError, message: str, args: tuple[object, ...]
    ) -> _Line:
        self._since = self._pending.last_line = now
        self._total = 1
        self._last_error = error
        note = (
            f" Further failures are summarised every {self.interval:g} s until Redis answers again."
        )
        ago = None if self._last_traceback is None else now - self._last_traceback
        if ago is not None and ago < self.interval:  # flapping: the cause is fresh in the log
            return (
                logging.ERROR,
                message + note + " (Traceback as logged %.1f s ago: %s)",
                (*args, ago, error),
                None,
            )
        self._last_traceback = now
        return logging.ERROR, message + note, args, error

    def _count(self, error: LockBackendError, where: str) -> None:
        self._total += 1
        self._last_error = error
        self._pending.add((str(error.name), where))  # past KEPT keys: "elsewhere"

    def _summarise(self, now: float) -> _Line:
        seconds = now - self._pending.last_line
        pending, where, _ = self._pending.take(now)
        shown = where.most_common(SHOWN)
        parts = [f"{name!r} under {view}: {count}" for (name, view), count in shown]
        rest = pending - sum(count for _, count in shown)
        if rest:
            parts.append(f"{rest} elsewhere")
        line: _Line = (
            logging.ERROR,
            "Redis still unavailable for locks: %d failed call(s) in the last %.1f s (%s); "
            "down for %.1f s; last cause: %s",
            (
                pending,
                seconds,
                ", ".join(parts),
                now - (self._since or now),
                self._last_error,
            ),
            None,
        )
        return line
