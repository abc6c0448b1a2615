"""A holder paused past its lease, mid-deduction, cannot oversell (issue: faults).

The worker takes the item's lock inside ``deduct()`` and is stopped (SIGSTOP)
just before its guarded UPDATE. While it is stopped its lease runs out, another
buyer takes the lock and sells the whole stock. When the stale holder resumes
and writes, the database guard (``stock >= quantity``) refuses the write.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from django.test import override_settings

from tests.support.procs import CTX, processes

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def _stale_buyer(pk: int, events: Any, commands: Any) -> None:
    from django_redislock import InsufficientStock, LockLostError
    from django_redislock import models as inventory
    from tests.models import Item

    original = inventory._update_returning_sql

    def pause_before_writing(*args: Any) -> Any:
        events.put(("about to write", os.getpid()))
        assert commands.get(timeout=60) == "write"  # SIGSTOP and SIGCONT happen before this
        return original(*args)

    inventory._update_returning_sql = pause_before_writing  # type: ignore[assignment]
    with override_settings(REDISLOCK={"TIMEOUT": 1.0}):
        item = Item.objects.get(pk=pk)
        try:
            left = item.deduct(5)
        except InsufficientStock as exc:
            events.put(("refused", exc.available))
        except LockLostError:
            events.put(("lost", None))
        else:
            events.put(("sold", left))


def test_paused_holder_cannot_oversell_through_the_inventory() -> None:
    from tests.models import Item

    item = Item.objects.create(stock=5)
    events, commands = CTX.Queue(), CTX.Queue()
    with processes(_stale_buyer, [(item.pk, events, commands)], timeout=60):
        kind, pid = events.get(timeout=60)
        assert kind == "about to write"
        os.kill(pid, signal.SIGSTOP)
        try:
            # waits for the stopped holder's 1 s lease to run out, then sells everything
            assert Item.objects.get(pk=item.pk).deduct(5) == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        commands.put("write")
        outcome = events.get(timeout=30)
    assert outcome in {("refused", 0), ("lost", None)}, outcome
    item.refresh_from_db()
    assert item.stock == 0


def _child_buyer_without_its_lock(pk: int, events: Any, commands: Any) -> None:
    """Deducts 3 from an ``UncappedChild`` as a buyer whose lease was lost
    does: nothing serialises it with the other buyer any more, so only the
    guarded write stands between them. It waits before each ``UPDATE``."""
    from django.db import connection

    from django_redislock import InsufficientStock, transactions
    from tests.models import UncappedChild

    transactions.hold_until_transaction_end = lambda *args: None  # type: ignore[assignment]

    def before_each_update(execute: Any, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith("UPDATE"):
            events.put("about to write")
            assert commands.get(timeout=60) == "write"
        return execute(sql, *args)

    item = UncappedChild.objects.get(pk=pk)
    with connection.execute_wrapper(before_each_update):
        try:
            left = item.deduct(3)
        except InsufficientStock as exc:
            events.put(("refused", exc.available))
        else:
            events.put(("sold", left))


@pytest.mark.django_db(transaction=True)
def test_a_multi_table_child_without_its_lock_cannot_oversell_its_parents_stock() -> None:
    """The child's stock lives in its parent's table. Its deduction went
    through Django's update of a parent's field, a SELECT of the ids where
    ``stock >= 3`` and then ``UPDATE ... SET stock = stock - 3 WHERE id IN
    (ids)``: the guard was in the SELECT, not in the UPDATE, so a buyer whose
    lock was lost between the two took the stock below zero (found by a
    review). The race needs row-level locking: SQLite's file lock serialises
    the two transactions."""
    from django.db import connection

    from tests.models import Uncapped, UncappedChild

    if connection.vendor == "sqlite":
        pytest.skip("SQLite's file lock serialises the transactions; run on PostgreSQL")
    item = UncappedChild.objects.create(stock=5)
    events, commands = CTX.Queue(), CTX.Queue()
    with processes(_child_buyer_without_its_lock, [(item.pk, events, commands)], timeout=60):
        assert events.get(timeout=60) == "about to write"
        assert UncappedChild.objects.get(pk=item.pk).deduct(3) == 2  # the other buyer
        commands.put("write")
        outcome = events.get(timeout=30)
        if outcome == "about to write":  # the guarded write has one UPDATE only
            commands.put("write")
            outcome = events.get(timeout=30)
    assert outcome == ("refused", 2), outcome
    assert Uncapped.objects.get(pk=item.pk).stock == 2
