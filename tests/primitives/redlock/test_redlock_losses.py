"""A Redlock holder told while it holds, as every other hold is (SPEC "Long
holds"): ``lost``, ``check()``, ``on_lost`` and ``max_hold``, on the suite's
five real Redlock servers."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.test import override_settings

from django_redislock import LockLostError, Redlock
from tests.support.scaleout import REDLOCK_ALIASES, RedlockServers

pytestmark = pytest.mark.scaleout

KEY = "redislock:{{{}}}:redlock"


class Told:
    """An ``on_lost`` callback that records each call and wakes the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, str, bool]] = []
        self.event = threading.Event()

    def __call__(self, hold: Any) -> None:
        self.calls.append((hold, threading.current_thread().name, hold.lost))
        self.event.set()


def test_a_lease_gone_from_a_majority_is_known_lost_and_told_once(
    redlock_servers: RedlockServers,
) -> None:
    told = Told()
    lock = Redlock("rl-loss:deleted", timeout=0.6, on_lost=told)
    with pytest.raises(LockLostError, match="rl-loss:deleted"):
        with lock:
            assert not lock.lost
            lock.check()  # held: nothing to say
            for server in redlock_servers.servers[:3]:  # a majority of five
                with server.client() as client:
                    assert client.delete(KEY.format("rl-loss:deleted")) == 1
            # a renewal every 0.2 s: told well within a second, however loaded the box
            assert told.event.wait(10)
            assert lock.lost
            with pytest.raises(LockLostError, match="rl-loss:deleted"):
                lock.check()
    # once, with the handle, on the loss-callback thread (never the watchdog's)
    assert told.calls == [(lock, "django-redislock-on-lost", True)]
    assert not lock.lost  # left: it holds nothing now
    lock.check()


def test_a_lease_gone_from_a_minority_is_kept(redlock_servers: RedlockServers) -> None:
    told = Told()
    lock = Redlock("rl-loss:minority", timeout=0.6, on_lost=told)
    with lock:
        for server in redlock_servers.servers[:2]:
            with server.client() as client:
                client.delete(KEY.format("rl-loss:minority"))
        lock.extend()  # a majority still holds it: ours
        assert not lock.lost
        lock.check()
    assert told.calls == []


def test_max_hold_stops_the_renewal_and_tells_the_holder(
    redlock_servers: RedlockServers,
) -> None:
    told = Told()
    lock = Redlock("rl-loss:capped", timeout=0.6, max_hold=0.5, on_lost=told)
    with pytest.raises(LockLostError, match=r"held longer than max_hold=0.5s"):
        with lock:
            assert told.event.wait(15)
            assert lock.lost
            with pytest.raises(LockLostError, match="max_hold"):
                lock.check()
    assert len(told.calls) == 1


def test_the_max_hold_setting_caps_a_redlock_too(redlock_servers: RedlockServers) -> None:
    from django.conf import settings

    told = Told()
    with override_settings(REDISLOCK={**settings.REDISLOCK, "REDLOCK": REDLOCK_ALIASES,
                                      "MAX_HOLD": 0.5}):  # fmt: skip
        lock = Redlock("rl-loss:setting", timeout=0.6, on_lost=told)
        with pytest.raises(LockLostError, match=r"max_hold=0.5s"), lock:
            assert told.event.wait(15)
            assert lock.lost


def test_the_loss_options_read_back_and_are_checked(redlock_servers: RedlockServers) -> None:
    def on_lost(hold: Any) -> None: ...

    lock = Redlock("rl-loss:options", on_lost=on_lost, max_hold=60)
    assert (lock.on_lost, lock.max_hold) == (on_lost, 60)
    plain = Redlock("rl-loss:plain")
    assert plain.on_lost is None and plain.max_hold is None and not plain.lost
    plain.check()  # holds nothing: nothing to say
    with pytest.raises(TypeError, match="on_lost must be a callable"):
        Redlock("rl-loss:bad", on_lost=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_hold"):
        Redlock("rl-loss:bad", max_hold=-1)
