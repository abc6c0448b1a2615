"""Only time spent in line is a wait: an uncontended acquire that was slow to
send its first attempt (a new connection pool, a busy CPU, a GC pause) is not.

Before, ``lock_acquired``'s ``waited`` was the time from the call to its
first attempt, and the hot-names panel counted anything from 1 ms as a wait:
on a loaded machine an uncontended acquire showed as a wait now and then
(``test_hot_names_panel_ranks_and_charts`` saw Waits 4 for 3).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_redislock import Lock, Semaphore
from django_redislock import signals as lock_signals
from django_redislock.holds import counters
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture

PAUSE = 0.05  # far above the panel's 1 ms threshold


def slow(real: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        time.sleep(PAUSE)  # the pause being simulated, not a synchronisation
        return real(*args, **kwargs)

    return call


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[counters.Tally]:
    """A tally of the test's own, in place of the process's for the test: what
    it tallies is read from memory, so no flush or write can change it."""
    own = counters.Tally(background=False)
    for count in ("acquired", "contended", "lost"):
        monkeypatch.setattr(counters, count, getattr(own, count))
    try:
        yield own
    finally:
        own.reset()


def waits_of(recorder: counters.Tally, name: str) -> int:
    """The waits ``recorder`` tallied for ``name`` (the hot-names panel's count)."""
    return sum(
        entry[counters._WAITS]
        for entry in recorder._pending.values()
        if entry[counters._NAME] == name
    )


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_slow_start_is_not_a_wait(
    kind: str, recorder: counters.Tally, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "lock":
        import django_redislock.primitives.first_step as steps

        monkeypatch.setattr(
            "django_redislock.primitives.first_step.holder_description",
            slow(steps.holder_description),
        )
        primitive: Any = Lock("slow-start")
    else:
        import django_redislock.primitives.permits as permits

        monkeypatch.setattr(
            "django_redislock.primitives.permits.new_token", slow(permits.new_token)
        )
        primitive = Semaphore("slow-start", 2)
    started = time.monotonic()
    with capture(lock_signals.lock_acquired) as acquired, primitive:
        pass
    assert time.monotonic() - started >= PAUSE  # the pause happened inside the acquire
    assert [c["waited"] for c in acquired] == [0.0]
    assert waits_of(recorder, "slow-start") == 0


def test_a_wait_in_line_is_still_a_wait(
    recorder: counters.Tally, other_thread: OtherThread
) -> None:
    holder = Lock("in-line", auto_renew=False)
    assert other_thread(holder.acquire)
    timer = threading.Timer(0.2, other_thread, (holder.release,))
    with capture(lock_signals.lock_acquired) as acquired:
        timer.start()
        with Lock("in-line", blocking_timeout=10):
            pass
    timer.join(10)
    assert [c["waited"] >= 0.1 for c in acquired] == [True]
    assert waits_of(recorder, "in-line") == 1
