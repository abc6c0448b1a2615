"""``max_hold`` and ``REDISLOCK["MAX_HOLD"]``: a cap on renewal.

The watchdog renews any live holder, a hung one too; with a cap it stops
that long after the acquire, tells the holder as for any loss (saying why),
and the lease then runs out in Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import Lock, LockLostError, Semaphore
from django_redislock import signals as lock_signals
from django_redislock.conf import validate
from django_redislock.holds.dropped import LostLeases
from django_redislock.holds.watchdog import watchdog
from tests.support.signals_helper import capture


def wait_for(predicate: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)  # polling Redis: nothing tells us a key expired


def test_renewal_stops_at_max_hold_and_the_key_expires(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a log of losses of its own: an earlier test's loss would make this one summarised
    monkeypatch.setattr(watchdog, "losses", LostLeases(logging.getLogger("test.losses")))
    told = threading.Event()
    lock = Lock("cap:lock", timeout=0.6, max_hold=1.0, on_lost=lambda hold: told.set())
    key = "redislock:{cap:lock}:lock"
    with caplog.at_level(logging.WARNING), capture(lock_signals.lock_lost) as lost_calls:
        with pytest.raises(LockLostError, match=r"held longer than max_hold=1s"):
            with lock:
                acquired = time.monotonic()
                assert told.wait(15)
                assert time.monotonic() - acquired >= 1.0  # never before the cap
                assert lock.lost
                with pytest.raises(LockLostError, match="max_hold"):
                    lock.check()
                # renewed no more: the lease runs out in Redis while the holder still holds
                wait_for(lambda: not redis_client.exists(key), "the capped lease's expiry")
    assert [call["reason"] for call in lost_calls] == [
        "held longer than max_hold=1s; the watchdog stopped renewing it"
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("cap:lock" in w and "held longer than max_hold=1s" in w for w in warnings)


def test_a_hold_released_before_its_cap_is_not_lost(redis_client: redis.Redis) -> None:
    told: list[Any] = []
    with capture(lock_signals.lock_lost) as lost_calls:
        with Lock("cap:short", timeout=5, max_hold=60, on_lost=told.append) as lock:
            assert not lock.lost
    assert not lost_calls and not told
    assert not redis_client.exists("redislock:{cap:short}:lock")


def test_the_setting_caps_every_hold_and_the_argument_wins(redis_client: redis.Redis) -> None:
    with override_settings(REDISLOCK={"MAX_HOLD": 0.8}):
        with capture(lock_signals.lock_lost) as lost_calls:
            sem = Semaphore("cap:setting", 1, timeout=0.6)
            with pytest.raises(LockLostError, match=r"max_hold=0\.8s"), sem:
                wait_for(lambda: sem.lost, "the capped permit's loss")
            # the argument wins over the setting: this one outlives 0.8 s
            with Lock("cap:own", timeout=1.0, max_hold=60) as lock:
                time.sleep(1.2)  # held past the setting's cap: the time itself is the subject
                assert not lock.lost
    assert [call["name"] for call in lost_calls] == ["cap:setting"]


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "60", True, 10**9])
def test_a_bad_max_hold_setting_is_e029(value: object) -> None:
    assert [p.id for p in validate({"MAX_HOLD": value})] == ["E029"]
    with override_settings(REDISLOCK={"MAX_HOLD": value}):
        with pytest.raises(ImproperlyConfigured, match="E029"):
            Lock("cap:bad").acquire()


@pytest.mark.parametrize("value", [None, 0.5, 60, 3600.0])
def test_a_good_max_hold_setting_passes(value: object) -> None:
    assert validate({"MAX_HOLD": value}) == []
