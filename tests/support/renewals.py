"""Watching, and holding back, the watchdog's renewals of one name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

#: The watchdog's scheduler thread, one per process.
THREAD_NAME = "django-redislock-watchdog"
#: The threads that send its renewals, one per connection pool in use.
RENEWAL_THREAD = "django-redislock-renewal"


def hold_back_renewals(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    before_send: Callable[[Any, float], None] | None = None,
) -> tuple[list[int], threading.Event]:
    """Run ``before_send(holding, lease)`` in the watchdog's renewal thread before each
    send of its renewals of ``name``. The list gets, per renewal, how many sends
    it took; the event is set when the first renewal is over. Only leases are
    kept, never a holding."""
    from django_redislock.holds.holding import Holding

    renew_call, renew = Holding.renew_call, Holding.renew
    sends: list[float] = []
    done: list[int] = []
    renewed = threading.Event()

    def held_back(self: Holding, lease: float) -> Any:
        if threading.current_thread().name == RENEWAL_THREAD and self.name == name:
            sends.append(lease)
            if before_send is not None:
                before_send(self, lease)
        return renew_call(self, lease)

    def counted(self: Holding) -> bool:
        first = len(sends)
        try:
            return renew(self)
        finally:
            if self.name == name:
                done.append(len(sends) - first)
                renewed.set()

    monkeypatch.setattr("django_redislock.holds.holding.Holding.renew_call", held_back)
    monkeypatch.setattr("django_redislock.holds.holding.Holding.renew", counted)
    return done, renewed
