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

from tests.procs import CTX, processes

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
