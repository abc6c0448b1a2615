"""A fence checked on the write alone orders writes; it does not guard a read-modify-write.

A stale holder (its own process, lease 1 s, no renewal) reads a counter and
is held up; the newer holder (this process) takes the lock, reads the same
count, and before it writes, the stale holder's increment lands: its token
is still above the row's fence, so ``fenced_update`` accepts it. The newer
holder's increment, made from the count it read, is accepted too: one
increment is lost (issue 31: seen once or twice a minute under faults).
``expected={"fence": <the fence read>}`` refuses the write whose read went
stale; the holder reads again and its retry counts both. On the suite's
database: SQLite by default, PostgreSQL when ``DATABASE_URL`` is set.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redislock import Lock, fenced_update
from tests.support.procs import CTX, processes

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("real_redis")]

NAME = "counter"
LEASE = 1.0


def _stale_holder(pk: int, guarded: bool, events: Any, commands: Any) -> None:
    """Take the lock, read the counter, and write its increment only when told."""
    from tests.models import FencedRecord

    lock = Lock(NAME, timeout=LEASE, auto_renew=False)
    assert lock.acquire(blocking=False)
    token = lock.fencing_token
    assert token is not None
    record = FencedRecord.objects.get(pk=pk)
    events.put(("read", token, record.writes))
    assert commands.get(timeout=60) == "write"  # by now its lease ran out
    expected = {"fence": record.fence} if guarded else None
    events.put(("wrote", fenced_update(record, token, expected=expected, writes=record.writes + 1)))


def increment(pk: int, token: int, *, guarded: bool, record: Any = None) -> tuple[bool, int]:
    """One read-modify-write (of ``record`` when it was read already):
    whether the write was accepted, and the count it wrote."""
    from tests.models import FencedRecord

    if record is None:
        record = FencedRecord.objects.get(pk=pk)
    expected = {"fence": record.fence} if guarded else None
    count = record.writes + 1
    return fenced_update(record, token, expected=expected, writes=count), count


def race(guarded: bool) -> tuple[int, list[bool]]:
    """The interleaving: stale read, fresh read, stale write, fresh write (and
    a fresh retry when refused). The final count, and each fresh write's result."""
    from tests.models import FencedRecord

    row = FencedRecord.objects.create(writes=0)
    events, commands = CTX.Queue(), CTX.Queue()
    with processes(_stale_holder, [(row.pk, guarded, events, commands)], timeout=60):
        kind, stale_token, stale_read = events.get(timeout=60)
        assert (kind, stale_read) == ("read", 0)
        fresh = Lock(NAME, timeout=30, blocking_timeout=15)
        assert fresh.acquire(), "the stale holder's lease never ran out"
        token = fresh.fencing_token
        assert token is not None and token > stale_token
        read = FencedRecord.objects.get(pk=row.pk)  # the newer holder reads...
        assert read.writes == 0
        commands.put("write")  # ...and the stale holder's write lands before its own
        assert events.get(timeout=30) == ("wrote", True)
        results = [increment(row.pk, token, guarded=guarded, record=read)[0]]
        if not results[0]:  # refused: read again, still holding the lock, and retry
            results.append(increment(row.pk, token, guarded=guarded)[0])
        fresh.release()
    row.refresh_from_db()
    return row.writes, results


@pytest.mark.django_db(transaction=True)
def test_a_fence_checked_only_on_the_write_loses_an_increment() -> None:
    """The hazard the docs warn of: both writes accepted, one increment lost."""
    count, results = race(guarded=False)
    assert results == [True]
    assert count == 1, "the stale write did not land between the read and the write"


@pytest.mark.django_db(transaction=True)
def test_guarding_on_the_fence_read_refuses_a_read_modify_write_gone_stale() -> None:
    count, results = race(guarded=True)
    assert results == [False, True], "the write made from a stale read was accepted"
    assert count == 2, "an increment was lost"
