"""The watchdog's schedule on its own, fed times (no thread, no server).

The renewals one call carried come back together and go into the heap as one
item: these tests hold it to every outcome a single renewal had when each
lease was an item of its own."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from django_redislock.holds.schedule import OVERDUE, RENEW, Entry, Schedule


class Held:
    """A holding as the schedule sees it."""

    def __init__(self, lease: float = 3.0, deadline: float = 3.0) -> None:
        self.renew_interval = lease / 3
        self.lease_deadline = deadline
        self.lane: Hashable = "lane"


def watched(schedule: Schedule, *holdings: Held, due: float = 1.0) -> list[Entry]:
    entries = [Entry(holding, due) for holding in holdings]  # type: ignore[arg-type]
    for entry in entries:
        schedule.add(entry)
    return entries


def back(schedule: Schedule, *holdings: Held, due: float) -> float:
    """The renewals of ``holdings``, sent in one call, came back."""
    renewed: list[tuple[Any, float]] = [(holding, due) for holding in holdings]
    return schedule.renewed(renewed)


def kinds(found: list[tuple[str, Entry, Hashable]]) -> list[tuple[str, Entry]]:
    return [(kind, entry) for kind, entry, _ in found]


def test_a_batch_renewed_together_is_one_item_of_the_heap() -> None:
    schedule = Schedule()
    holdings = [Held() for _ in range(300)]
    entries = watched(schedule, *holdings)
    found, _ = schedule.take(1.0, 4096, 0.2)
    assert kinds(found) == [(RENEW, entry) for entry in entries]
    for holding in holdings:
        holding.lease_deadline = 4.0
    earliest = back(schedule, *holdings, due=2.0)
    assert earliest == 2.0
    live = [item for item in schedule.heap if any(e.seq == item[1] for e in item[2])]
    assert len(live) == 1  # was 300
    found, next_due = schedule.take(1.5, 4096, 0.2)
    assert found == [] and next_due == 2.0
    found, _ = schedule.take(2.0, 4096, 0.2)
    assert len(found) == 300 and {kind for kind, _, _ in found} == {RENEW}


def test_a_renewal_due_later_waits_and_says_when() -> None:
    schedule = Schedule()
    holding = Held()
    watched(schedule, holding, due=5.0)
    found, next_due = schedule.take(4.0, 4096, 0.2)
    assert found == [] and next_due == 5.0
    found, _ = schedule.take(4.96, 4096, 0.2)  # within EARLY of its interval
    assert [kind for kind, _, _ in found] == [RENEW]


def test_a_renewal_not_back_by_its_lease_end_is_overdue_and_forgotten() -> None:
    schedule = Schedule()
    holding = Held(deadline=3.0)
    (entry,) = watched(schedule, holding)
    assert kinds(schedule.take(1.0, 4096, 0.2)[0]) == [(RENEW, entry)]
    found, next_due = schedule.take(2.9, 4096, 0.2)
    assert found == [] and next_due == 3.0  # its lease end is looked at next
    assert kinds(schedule.take(3.0, 4096, 0.2)[0]) == [(OVERDUE, entry)]
    assert schedule.watched == {}


def test_an_extend_that_moved_the_lease_end_is_looked_at_again_then() -> None:
    schedule = Schedule()
    holding = Held(deadline=3.0)
    watched(schedule, holding)
    schedule.take(1.0, 4096, 0.2)
    holding.lease_deadline = 10.0  # extended while the renewal was on its way
    found, next_due = schedule.take(3.0, 4096, 0.2)
    assert found == [] and next_due == 10.0
    assert len(schedule.watched) == 1


def test_a_pass_takes_at_most_its_limit_and_leaves_the_rest_due() -> None:
    schedule = Schedule()
    holdings = [Held() for _ in range(10)]
    watched(schedule, *holdings)
    schedule.take(1.0, 4096, 0.2)
    back(schedule, *holdings, due=2.0)
    first, next_due = schedule.take(2.0, 4, 0.2)
    assert len(first) == 4 and next_due == 2.0
    rest, _ = schedule.take(2.0, 4096, 0.2)
    assert len(rest) == 6
    assert {id(e) for _, e, _ in first}.isdisjoint({id(e) for _, e, _ in rest})


def test_released_and_dropped_holdings_in_an_item_are_skipped() -> None:
    schedule = Schedule()
    holdings = [Held() for _ in range(3)]
    entries = watched(schedule, *holdings)
    schedule.take(1.0, 4096, 0.2)
    back(schedule, *holdings, due=2.0)
    schedule.remove(id(holdings[0]))  # released
    dropped = holdings.pop(1)
    dropped_key = id(dropped)
    del dropped  # freed without a release
    found, _ = schedule.take(2.0, 4096, 0.2)
    assert kinds(found) == [(RENEW, entries[2])]
    assert dropped_key not in schedule.watched


def test_a_holding_renewed_twice_in_one_call_is_taken_once() -> None:
    schedule = Schedule()
    holding = Held()
    watched(schedule, holding)
    schedule.take(1.0, 4096, 0.2)
    back(schedule, holding, holding, due=2.0)
    found, _ = schedule.take(2.0, 4096, 0.2)
    assert len(found) == 1


def test_a_heap_grown_mostly_stale_is_rebuilt() -> None:
    schedule = Schedule()
    for _ in range(3000):
        holding = Held()
        watched(schedule, holding, due=100.0)
        schedule.remove(id(holding))
    assert len(schedule.heap) <= 1024 + 1
