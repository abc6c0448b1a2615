"""The watchdog's schedule: which lease is renewed when, as a heap.

The scheduler looked at every watched lease on each pass: with 20,000
leases that scan took more of its thread than the renewals, under the lock
every acquire takes. A heap of due times makes a pass cost the renewals it
hands over. An entry moved (renewed, extended, unwatched) leaves its old
item behind, stale (its ``seq`` is no longer the entry's), dropped when it
reaches the top; a heap grown mostly stale (holds released long before
their renewal) is rebuilt.

Not thread-safe: the watchdog calls it under its lock.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_redislock.holds.renewals import Renewable

#: A renewal due within this share of its interval (a quarter of
#: ``retry_delay`` at most) goes with the pass that finds it.
EARLY = 0.1


class Entry:
    """A watched holding (weakly), when its renewal is due (``due``), its
    lease (for the lag), whether that renewal is on its way (``sent``), and
    its place in the heap (``seq``; -1: no longer watched)."""

    __slots__ = ("due", "key", "lane", "lease", "ref", "sent", "seq")

    def __init__(self, holding: Renewable, due: float) -> None:
        self.ref = weakref.ref(holding)
        self.key = id(holding)
        self.lane: Hashable = holding.lane
        self.sent = False
        self.seq = 0
        self.due = due
        self.lease = 3 * holding.renew_interval


#: What a pass found: renewals to send, and renewals overdue (their lease
#: ended before they came back), each with its entry.
RENEW = "renew"
OVERDUE = "overdue"


class Schedule:
    def __init__(self) -> None:
        self.watched: dict[int, Entry] = {}  # by id(holding)
        # (when, seq, entry): a renewal due, or (entry.sent) the lease end by
        # which it must be back
        self.heap: list[tuple[float, int, Entry]] = []
        self._seq = 0

    def add(self, entry: Entry) -> None:
        old = self.watched.get(entry.key)
        if old is not None:
            old.seq = -1
        self.watched[entry.key] = entry
        self.push(entry, entry.due)

    def remove(self, key: int) -> Entry | None:
        entry = self.watched.pop(key, None)
        if entry is not None:
            entry.seq = -1
        return entry

    def push(self, entry: Entry, when: float) -> None:
        """``entry`` is next looked at ``when``; its earlier items go stale."""
        self._seq += 1
        entry.seq = self._seq
        heap = self.heap
        heapq.heappush(heap, (when, self._seq, entry))
        if len(heap) > 2 * len(self.watched) + 1024:
            heap[:] = [item for item in heap if item[2].seq == item[1]]
            heapq.heapify(heap)

    def renewed(self, holding: Renewable, due: float) -> bool:
        """``holding``'s renewal came back; the next is due at ``due``.
        ``False`` if it is no longer watched."""
        entry = self.watched.get(id(holding))
        if entry is None or entry.ref() is not holding:
            return False
        entry.sent = False
        entry.due, entry.lease = due, 3 * holding.renew_interval
        self.push(entry, due)
        return True

    def take(
        self, now: float, limit: int, retry_delay: float
    ) -> tuple[list[tuple[str, Entry, Hashable]], float]:
        """From the top of the heap, up to ``limit``: each renewal due now
        (``RENEW``, marked sent: its lease end is looked at next) and each
        renewal sent that is not back by its lease end (``OVERDUE``, no
        longer watched), with the lane; and when the next is due. Forgets
        the holdings that were dropped."""
        found: list[tuple[str, Entry, Hashable]] = []
        heap = self.heap
        while heap and len(found) < limit:
            when, seq, entry = heap[0]
            holding = entry.ref() if entry.seq == seq else None
            if holding is None:
                heapq.heappop(heap)
                if entry.seq == seq:  # dropped
                    self._forget(entry)
                continue
            if entry.sent:  # ``when`` is its lease end: is its renewal back?
                if when > now:
                    return found, when
                if holding.lease_deadline > now:  # moved on (an extend)
                    self._replace(entry, holding.lease_deadline)
                    continue
                heapq.heappop(heap)
                self._forget(entry)
                found.append((OVERDUE, entry, entry.lane))
            else:
                if when > now + min(holding.renew_interval * EARLY, retry_delay / 4):
                    return found, when
                entry.sent = True
                self._replace(entry, holding.lease_deadline)
                found.append((RENEW, entry, entry.lane))
        return found, (heap[0][0] if heap else float("inf"))

    def _forget(self, entry: Entry) -> None:
        """No longer watched (unless its key was given to another meanwhile)."""
        entry.seq = -1
        if self.watched.get(entry.key) is entry:
            del self.watched[entry.key]

    def _replace(self, entry: Entry, when: float) -> None:
        """The top item is ``entry``'s: look at it again ``when``."""
        self._seq += 1
        entry.seq = self._seq
        heapq.heapreplace(self.heap, (when, self._seq, entry))

    def oldest_due(self) -> float | None:
        """The due time of a renewal not yet sent near the top, if any."""
        times = [when for when, seq, entry in self.heap[:8] if entry.seq == seq and not entry.sent]
        return min(times, default=None)

    def census(self, now: float) -> tuple[int, int, float]:
        """Holds whose renewal is overdue, holds watched, renewals owed a second."""
        at_risk = holds = 0
        owed = 0.0
        for entry in list(self.watched.values()):
            holding = entry.ref()
            if holding is not None:
                holds += 1
                at_risk += entry.due < now
                owed += 1 / max(holding.renew_interval, 1e-3)
        return at_risk, holds, owed
