"""What the watchdog does once a batch of renewals is due in a lane: send
it, tell ``Lag`` how late it went, then schedule each lease's next renewal
(all under one lock), retry it, or report its loss (``Holding.mark_lost``).

``Settling`` is a part of ``Watchdog`` (``holds/watchdog.py``), given what
it needs of it when made: how to schedule renewed holds (the watchdog's
schedule), how to stop watching one, and its ``Lag``. It owns the retry log.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from django_redislock.exceptions import LockBackendError
from django_redislock.holds.dropped import Summary
from django_redislock.holds.lag import Lag
from django_redislock.holds.losses import capped_reason
from django_redislock.holds.renewals import MAX_BATCH, Renewable, Result, renew_all
from django_redislock.holds.schedule import Entry

logger = logging.getLogger("django_redislock.holds.watchdog")

#: Retry delay after a renewal that could not reach Redis.
RETRY_DELAY = 0.2
#: Seconds between two log lines of renewals that failed and are retried.
RETRY_LOG_EVERY = 1.0


def _due(holding: Renewable, now: float) -> float:
    """A third of the way into the lease; sooner when what is left of it, as the
    holder measures it, is shorter (a handoff's first lease, an extend that
    crossed a renewal)."""
    due = now + min(holding.renew_interval, max(0.0, holding.lease_deadline - now) / 3)
    hooks = holding.hooks
    if hooks is not None and hooks.until < due:  # max_hold: looked at when it is reached
        until: float = hooks.until
        return max(until, now)
    return due


class Settling:
    """The renewal side of ``Watchdog``, run in its lanes.

    ``renewed([(holding, due), ...])`` schedules each one's next renewal;
    ``unwatch(holding)`` renews it no more; ``lagging`` is told how late the
    renewals go."""

    def __init__(
        self,
        renewed: Callable[[list[tuple[Renewable, float]]], None],
        unwatch: Callable[[Renewable], None],
        lagging: Lag,
    ) -> None:
        self._renewed = renewed
        self._unwatch = unwatch
        self.lagging = lagging
        #: Renewals failed and retried: a line a second (a server down fails them all).
        self._retries: Summary[None] = Summary(RETRY_LOG_EVERY)

    def overdue(self, entries: list[Entry]) -> None:
        """Report renewals still unanswered at their lease end; the lag
        first, so a process told it is behind hears it before its losses."""
        now = time.monotonic()
        with contextlib.suppress(Exception):
            share = max((now - entry.due) / (entry.lease or 1.0) for entry in entries)
            self.lagging.observe(now - min(entry.due for entry in entries), share, 0, now)
        holdings = [holding for holding in (entry.ref() for entry in entries) if holding]
        _each(holdings, lambda h: h.mark_lost("no answer to the renewal before the lease ended"))

    def renew(self, entries: list[Entry]) -> None:
        """Renew these holdings, together where they can be (``renewals``);
        tell ``Lag`` how late they go; then schedule each one's next renewal
        (under one lock), or retry it, or report its loss."""
        now = time.monotonic()
        late = now - min(entry.due for entry in entries)
        share = max((now - entry.due) / (entry.lease or 1.0) for entry in entries)
        with contextlib.suppress(Exception):  # a logging handler's error: renew anyway
            self.lagging.observe(late, share, len(entries), now)
        refs = self._uncapped(entries, now)
        del entries
        renewed: list[tuple[Renewable, float]] = []
        failed: list[Result] = []
        for result in renew_all(refs):
            holding, started, outcome = result
            if outcome is True:
                renewed.append((holding, _due(holding, started)))
            else:
                failed.append(result)
        self._renewed(renewed)
        _each(failed, self._settle)

    def _uncapped(self, entries: list[Entry], now: float) -> list[weakref.ref[Renewable]]:
        """The entries to renew: a hold past its ``max_hold`` is renewed no
        more and reported lost (``holds/losses.py``), the reason saying so."""
        refs = []
        capped = []
        for entry in entries:
            holding = entry.ref()
            hooks = None if holding is None else holding.hooks
            if hooks is not None and now >= hooks.until:
                capped.append(holding)
            else:
                refs.append(entry.ref)
        holding = None  # kept by nobody while the others are renewed
        if capped:
            _each(capped, lambda h: self.lose(h, capped_reason(h.hooks.max_hold)))
        return refs

    def _settle(self, result: Result) -> None:
        """After a renewal that did not renew: retry, or report the loss."""
        holding, started, outcome = result
        if isinstance(outcome, Exception):
            self._failed(holding, started, outcome)
        elif not outcome:
            self.lose(holding, "the lease was gone when the watchdog renewed it")
        else:
            self._renewed([(holding, _due(holding, started))])

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
            self.lose(holding, reason)
            return
        if not isinstance(exc, LockBackendError):
            logger.error("Lease renewal crashed; retrying", exc_info=exc)
        elif now < self._retries.last_line + RETRY_LOG_EVERY:
            self._retries.add()
        else:
            more = self._retries.take(now)[0]
            since = f" ({more:,} more failed since the last such line)" if more else ""
            logger.warning("Lease renewal failed, retrying: %s%s", exc, since)
        self._renewed([(holding, time.monotonic() + RETRY_DELAY)])

    def lose(self, holding: Renewable, reason: str) -> None:
        """Renew ``holding`` no more and report its loss (``Holding.mark_lost``)."""
        self._unwatch(holding)
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
