"""What the watchdog does once a batch of renewals is due in a lane: send
it, tell ``Lag`` how late it went, then schedule each lease's next renewal
(all under one lock), retry it, or report its loss (``Holding.mark_lost``).

``Settling`` is a base of ``Watchdog`` (``holds/watchdog.py``), which owns
the state used here: its condition, its ``Schedule``, ``Lag`` and retry log.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django_redislock.exceptions import LockBackendError
from django_redislock.holds.lag import Lag
from django_redislock.holds.renewals import MAX_BATCH, Renewable, Result, renew_all
from django_redislock.holds.schedule import Entry, Schedule

logger = logging.getLogger("django_redislock.holds.watchdog")

#: Retry delay after a renewal that could not reach Redis.
RETRY_DELAY = 0.2
#: Seconds between two log lines of renewals that failed and are retried.
RETRY_LOG_EVERY = 1.0


def _due(holding: Renewable, now: float) -> float:
    """A third of the way into the lease; sooner when what is left of it, as the
    holder measures it, is shorter (a handoff's first lease, an extend that
    crossed a renewal)."""
    return now + min(holding.renew_interval, max(0.0, holding.lease_deadline - now) / 3)


class Settling:
    """The renewal side of ``Watchdog``, run in its lanes."""

    _cond: threading.Condition
    _schedule: Schedule
    _wake_at: float
    lagging: Lag
    _retry_logged: list[Any]

    def unwatch(self, holding: Renewable) -> None:
        raise NotImplementedError

    def _overdue(self, entries: list[Entry]) -> None:
        """Report renewals still unanswered at their lease end; the lag
        first, so a process told it is behind hears it before its losses."""
        now = time.monotonic()
        with contextlib.suppress(Exception):
            share = max((now - entry.due) / (entry.lease or 1.0) for entry in entries)
            self.lagging.observe(now - min(entry.due for entry in entries), share, 0, now)
        holdings = [holding for holding in (entry.ref() for entry in entries) if holding]
        _each(holdings, lambda h: h.mark_lost("no answer to the renewal before the lease ended"))

    def _renew(self, entries: list[Entry]) -> None:
        """Renew these holdings, together where they can be (``renewals``);
        tell ``Lag`` how late they go; then schedule each one's next renewal
        (under one lock), or retry it, or report its loss."""
        now = time.monotonic()
        late = now - min(entry.due for entry in entries)
        share = max((now - entry.due) / (entry.lease or 1.0) for entry in entries)
        with contextlib.suppress(Exception):  # a logging handler's error: renew anyway
            self.lagging.observe(late, share, len(entries), now)
        refs = [entry.ref for entry in entries]
        del entries
        renewed: list[tuple[Renewable, float]] = []
        failed: list[Result] = []
        for result in renew_all(refs):
            holding, started, outcome = result
            if outcome is True:
                renewed.append((holding, _due(holding, started)))
            else:
                failed.append(result)
        self._reschedule_all(renewed)
        _each(failed, self._settle)

    def _settle(self, result: Result) -> None:
        """After a renewal that did not renew: retry, or report the loss."""
        holding, started, outcome = result
        if isinstance(outcome, Exception):
            self._failed(holding, started, outcome)
        elif not outcome:
            self._lose(holding, "the lease was gone when the watchdog renewed it")
        else:
            self._reschedule(holding, _due(holding, started))

    def _failed(self, holding: Renewable, started: float, exc: Exception) -> None:
        """A renewal sent at ``started`` raised ``exc``: retry, or report the
        loss no later than the lease end. If another attempt, failing up to
        twice as slowly as this one and sent up to half a delay late (a busy
        machine), would end past it, give up now; early is safe.

        Any exception counts, not only ``LockBackendError`` (a client
        wrapper's own, a bug): retried for ever instead, the lease ran out
        with nobody told."""
        now = time.monotonic()
        if isinstance(exc, LockBackendError):
            reason = f"could not reach Redis before the lease ended: {exc}"
        else:
            reason = f"could not renew before the lease ended: {exc!r}"
        if now + 1.5 * RETRY_DELAY + 2 * (now - started) >= holding.lease_deadline:
            self._lose(holding, reason)
            return
        if not isinstance(exc, LockBackendError):
            logger.error("Lease renewal crashed; retrying", exc_info=exc)
        elif now - self._retry_logged[0] < RETRY_LOG_EVERY:
            self._retry_logged[1] += 1  # a line a second: a server down fails them all
        else:
            more, self._retry_logged[:] = self._retry_logged[1], [now, 0]
            since = f" ({more:,} more failed since the last such line)" if more else ""
            logger.warning("Lease renewal failed, retrying: %s%s", exc, since)
        self._reschedule(holding, time.monotonic() + RETRY_DELAY)

    def _reschedule(self, holding: Renewable, due: float) -> None:
        """After a renewal (from its lane): the next one is due at ``due``."""
        self._reschedule_all([(holding, due)])

    def _reschedule_all(self, renewed: list[tuple[Renewable, float]]) -> None:
        """After renewals (from their lane): each one's next is due when given."""
        if not renewed:
            return
        earliest = float("inf")
        with self._cond:
            for holding, due in renewed:
                if self._schedule.renewed(holding, due):
                    earliest = min(earliest, due)
            if earliest < self._wake_at:
                self._cond.notify()

    def _lose(self, holding: Renewable, reason: str) -> None:
        self.unwatch(holding)
        holding.mark_lost(reason)


def _batch_limit() -> int:
    """The ``RENEWAL_BATCH`` setting; the default when settings cannot be read."""
    try:
        from django_redislock.conf import get_settings

        return get_settings().renewal_batch
    except Exception:  # ImproperlyConfigured: the acquires report it
        return MAX_BATCH


def _each(items: Iterable[Any], func: Callable[[Any], object]) -> None:
    """``func`` on every item, even after one raised: an error is logged, and
    ``SystemExit`` from a ``lock_lost`` receiver raised once the rest are done."""
    stopped: BaseException | None = None
    for item in items:
        try:
            func(item)
        except Exception:  # the lane must survive anything
            logger.exception("Lease renewal crashed")
        except BaseException as exc:
            stopped = stopped or exc
    if stopped is not None:
        raise stopped
