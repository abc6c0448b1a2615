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
from django_redislock.ops import history as hot
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture

PAUSE = 0.05  # far above the panel's 1 ms threshold


def slow(real: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        time.sleep(PAUSE)  # the pause being simulated, not a synchronisation
        return real(*args, **kwargs)

    return call


@pytest.fixture
def recorder() -> Iterator[hot.Recorder]:
    """A history recorder of the test's own, tapped to the signals for the test:
    what it tallies is read from memory, so no other recorder, flush or write
    (and no earlier test that re-ran the apps' ``ready()``) can change it."""
    own = hot.Recorder(hot._connect, background=False)
    receivers = hot._receivers(own)
    for signal, receiver in receivers:
        lock_signals.tap(signal, receiver)
    try:
        yield own
    finally:
        for signal, receiver in receivers:
            lock_signals.untap(signal, receiver)
        own.forget_exit()
        own.reset()


def waits_of(recorder: hot.Recorder, name: str) -> int:
    """The waits ``recorder`` tallied for ``name`` (the hot-names panel's count)."""
    return sum(
        entry[hot.FIELDS.index("waits")]
        for (_, tallied), entry in recorder._tally.items()
        if tallied == name
    )


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_slow_start_is_not_a_wait(
    kind: str, recorder: hot.Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "lock":
        import django_redislock.primitives.lock_common as steps

        monkeypatch.setattr(
            "django_redislock.primitives.lock_common.holder_description",
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


def test_a_wait_in_line_is_still_a_wait(recorder: hot.Recorder, other_thread: OtherThread) -> None:
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
