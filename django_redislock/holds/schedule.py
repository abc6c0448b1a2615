"""The watchdog's schedule: which lease is renewed when, as a heap.

The scheduler looked at every watched lease on each pass: with 20,000
leases that scan took more of its thread than the renewals, under the lock
every acquire takes. A heap of due times makes a pass cost the renewals it
hands over. An item of the heap is every entry due at one time: the
renewals one call carried come back with one due time (and, sent, one lease
end), so 20,000 leases renewed 256 a call are some 80 items, not 20,000:
with an item per lease, pushing and popping them (tuple comparisons, some
30 per renewal) took a third of the scheduler's thread. An entry moved
(renewed, extended, unwatched) leaves its old item behind, stale there (its
``seq`` is no longer the item's), dropped when the item reaches the top; a
heap grown mostly stale (holds released long before their renewal) is
rebuilt.

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
        # (when, seq, entries): renewals due then, or (each entry.sent) the
        # lease end by which they must be back; an entry whose ``seq`` is no
        # longer the item's has moved on (it is stale there)
        self.heap: list[tuple[float, int, list[Entry]]] = []
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
        self._push([entry], when)

    def _push(self, entries: list[Entry], when: float) -> None:
        """``entries`` are next looked at ``when``, as one item (see the
        module's docstring); their earlier items go stale."""
        self._seq += 1
        seq = self._seq
        for entry in entries:
            entry.seq = seq
        heap = self.heap
        heapq.heappush(heap, (when, seq, entries))
        if len(heap) > 2 * len(self.watched) + 1024:
            kept = [(w, s, [e for e in es if e.seq == s]) for w, s, es in heap]
            heap[:] = [item for item in kept if item[2]]
            heapq.heapify(heap)

    def renewed(self, renewed: list[tuple[Renewable, float]]) -> float:
        """Each holding's renewal came back; its next is due when given.
        When the earliest of them still watched is due (``inf``: none is)."""
        by_due: dict[float, list[Entry]] = {}
        watched = self.watched
        for holding, due in renewed:
            entry = watched.get(id(holding))
            if entry is None or entry.ref() is not holding:
                continue
            entry.sent = False
            entry.due, entry.lease = due, 3 * holding.renew_interval
            by_due.setdefault(due, []).append(entry)
        for due, entries in by_due.items():
            self._push(entries, due)
        return min(by_due, default=float("inf"))

    def take(
        self, now: float, limit: int, retry_delay: float
    ) -> tuple[list[tuple[str, Entry, Hashable]], float]:
        """From the top of the heap, up to ``limit``: each renewal due now
        (``RENEW``, marked sent: its lease end is looked at next) and each
        renewal sent that is not back by its lease end (``OVERDUE``, no
        longer watched), with the lane; and when the next is due. Forgets
        the holdings that were dropped.

        An item's entries are due together; whether it is due now is asked
        of its first live holding (``EARLY`` of its interval): the entries
        of one item share a due time because they were renewed by one call,
        of one lease."""
        found: list[tuple[str, Entry, Hashable]] = []
        sent: dict[float, list[Entry]] = {}  # by lease end, pushed as items once done
        heap = self.heap
        while heap and len(found) < limit:
            when, seq, entries = heap[0]
            first = self._first_live(entries, seq)
            if first is None:
                heapq.heappop(heap)
                continue
            on_its_way, early = first
            if on_its_way:  # ``when`` is their lease end: are the renewals back?
                if when > now:
                    break
            elif when > now + min(early, retry_delay / 4):
                break
            heapq.heappop(heap)
            left = self._take_item(entries, seq, now, limit, found, sent)
            if left:
                self._push(left, when)
        for when, entries in sent.items():
            self._push(entries, when)
        return found, (heap[0][0] if heap else float("inf"))

    def _first_live(self, entries: list[Entry], seq: int) -> tuple[bool, float] | None:
        """Of the first entry still in an item whose holding is alive: whether
        its renewal is on its way, and how early it may go (``EARLY``); the
        dropped ones before it forgotten. ``None``: none is."""
        for entry in entries:
            if entry.seq != seq:
                continue
            holding = entry.ref()
            if holding is not None:
                return entry.sent, holding.renew_interval * EARLY
            self._forget(entry)
        return None

    def _take_item(
        self,
        entries: list[Entry],
        seq: int,
        now: float,
        limit: int,
        found: list[tuple[str, Entry, Hashable]],
        sent: dict[float, list[Entry]],
    ) -> list[Entry]:
        """``take`` of one item that is due: its live entries to ``found``
        (renewals sent to ``sent``, by lease end), up to ``limit``; the
        entries left beyond it."""
        for index, entry in enumerate(entries):
            if entry.seq != seq:
                continue
            holding = entry.ref()
            if holding is None:  # dropped
                self._forget(entry)
                continue
            if len(found) >= limit:
                return [e for e in entries[index:] if e.seq == seq]
            entry.seq = 0  # taken: the same entry again in this item is stale
            if entry.sent:
                if holding.lease_deadline > now:  # moved on (an extend)
                    sent.setdefault(holding.lease_deadline, []).append(entry)
                    continue
                self._forget(entry)
                found.append((OVERDUE, entry, entry.lane))
            else:
                entry.sent = True
                sent.setdefault(holding.lease_deadline, []).append(entry)
                found.append((RENEW, entry, entry.lane))
        return []

    def _forget(self, entry: Entry) -> None:
        """No longer watched (unless its key was given to another meanwhile)."""
        entry.seq = -1
        if self.watched.get(entry.key) is entry:
            del self.watched[entry.key]

    def oldest_due(self) -> float | None:
        """The due time of a renewal not yet sent near the top, if any."""
        times = [
            when
            for when, seq, entries in self.heap[:8]
            if any(entry.seq == seq and not entry.sent for entry in entries)
        ]
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
