"""How far behind the watchdog's renewals run, and the warning before leases lapse.

A renewal is due a third of the way into its lease, so it can run up to two
thirds of a lease late before the lease lapses. A process that holds more
leases than its watchdog can renew (each renewal costs CPU in the process
and time on the server: ``docs/operations.md#capacity``) falls behind a
little more every second, and then loses its leases by the thousand. Each
batch the watchdog sends tells how late its oldest renewal was; once that
passes ``LAG_WARNING`` of its lease, the process says so, once, with the
holds at risk and what to do, long before the first lease is lost; and
again only after it caught up (under half that share) and fell behind anew,
at most once per ``WARN_EVERY``. ``signals.renewal_lag`` is sent at each
change, and ``Watchdog.lag()`` gives the lag at any moment (the
OpenTelemetry bridge's ``redislock.renewal.lag`` gauge).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_redislock import signals

logger = logging.getLogger("django_redislock.watchdog")

#: Share of its lease a renewal may run late before the warning (a renewal
#: due at a third of the lease has two thirds to spare).
LAG_WARNING = 0.2
#: Seconds between two warnings, at least, should the lag come and go.
WARN_EVERY = 60.0


class Lag:
    """The lag seen by the last batches sent, and whether the process is
    warned; fed by the watchdog's lanes (``observe``)."""

    def __init__(self, sender: type, census: Callable[[], tuple[int, int, float]]) -> None:
        #: ``census()``: (holds at risk, holds renewed, renewals owed a second),
        #: worked out only when the state changes (it scans every hold).
        self._sender = sender
        self._census = census
        self._lock = threading.Lock()
        self.last = 0.0  # seconds the oldest renewal of the last batch was late
        self.lagging = False
        self._warned_at = -WARN_EVERY
        self._sent = 0  # renewals sent since ``_since``
        self._since = time.monotonic()
        self._rate = 0.0

    def observe(self, late: float, share: float, count: int, now: float) -> None:
        """A batch of ``count`` renewals was sent at ``now``, the oldest
        ``late`` seconds late, the worst ``share`` of its lease late."""
        self.last = max(late, 0.0)
        self._sent += count
        if now - self._since >= 1.0:
            self._rate = self._sent / (now - self._since)
            self._sent, self._since = 0, now
        if share > LAG_WARNING and not self.lagging:
            self._change(True, late, share, now)
        elif share < LAG_WARNING / 2 and self.lagging:
            self._change(False, late, share, now)

    def _change(self, lagging: bool, late: float, share: float, now: float) -> None:
        with self._lock:
            if self.lagging == lagging:
                return
            self.lagging = lagging
            warn = lagging and now - self._warned_at >= WARN_EVERY
            if warn:
                self._warned_at = now
        at_risk, holds, owed = self._census()
        if warn:
            logger.warning(
                "Lease renewals are running %.2f s late (%.0f%% of a lease) with %s of the "
                "%s holds this process renews at risk: it renews about %s leases a second "
                "and owes %s. Leases will be lost if it falls further behind. Use longer "
                "leases (timeout=) or fewer holds per process: see the capacity section "
                "of docs/operations.md.",
                late,
                share * 100,
                f"{at_risk:,}",
                f"{holds:,}",
                f"{self._rate:,.0f}",
                f"{owed:,.0f}",
            )
        elif not lagging:
            logger.info("Lease renewals caught up (%.2f s late).", late)
        signals.notify(
            signals.renewal_lag,
            sender=self._sender,
            lagging=lagging,
            lag=late,
            share=share,
            at_risk=at_risk,
            holds=holds,
        )
