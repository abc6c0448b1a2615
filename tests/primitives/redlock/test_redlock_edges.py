"""Redlock's contract where a review found it broken: fencing tokens of lost
locks, leases too short to work, re-entry per thread, servers that are one,
renewals that waited out a hung server."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import LockLostError, LockTimeout, Redlock
from django_redislock import signals as lock_signals
from tests.primitives.redlock.test_redlock import KEY, holders
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread, refused_elsewhere
from tests.support.scaleout import REDLOCK_ALIASES, RedlockServers
from tests.support.signals_helper import capture

pytestmark = pytest.mark.scaleout


def drop_on_majority(servers: RedlockServers, name: str) -> None:
    """Clear ``name`` on three of the five servers, as an operator or restarts would."""
    for server in servers.servers[:3]:
        with server.client() as client:
            client.delete(KEY.format(name))


# fencing tokens of a lost lock -------------------------------------------------------


def test_a_cached_fencing_token_is_refused_once_the_watchdog_finds_it_lost(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    told = threading.Event()

    def on_lost(**kwargs: Any) -> None:
        told.set()

    lock = Redlock("cached-fence", timeout=0.6)
    lock_signals.lock_lost.connect(on_lost)
    try:
        lock.acquire()
        token = lock.fencing_token
        assert token is not None and lock.fencing_token == token  # read once, cached
        drop_on_majority(redlock_servers, "cached-fence")
        assert told.wait(5)  # the watchdog's next renewal finds it gone
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
    with pytest.raises(LockLostError, match="watchdog"):
        _ = lock.fencing_token
    other = Redlock("cached-fence")
    assert other_thread(other.acquire, blocking=False)
    assert other_thread(lambda: other.fencing_token) > token
    other_thread(other.release)
    with pytest.raises(LockLostError):
        lock.release()


def test_a_cached_fencing_token_is_refused_once_its_lease_ended(
    redlock_servers: RedlockServers,
) -> None:
    lock = Redlock("ended-fence", timeout=0.2, auto_renew=False)
    lock.acquire()
    assert lock.fencing_token is not None
    time.sleep(0.3)  # the subject is the lease running out, unrenewed
    with capture(lock_signals.lock_lost) as lost:
        with pytest.raises(LockLostError, match="lease had ended"):
            _ = lock.fencing_token
    assert len(lost) == 1
    with pytest.raises(LockLostError):
        lock.release()


# leases too short to leave any validity ---------------------------------------------------


@pytest.mark.parametrize("timeout", [0.001, 0.002, 0.003, 0.0099])
def test_a_lease_too_short_for_the_drift_allowance_is_a_value_error(timeout: float) -> None:
    with pytest.raises(ValueError, match=r"at least 0\.01 s \(10 ms\).*below 2\.02 ms"):
        Redlock("tiny", timeout=timeout)


def test_the_minimum_lease_holds_for_extend_and_the_default_lease(
    redlock_servers: RedlockServers,
) -> None:
    assert Redlock("shortest", timeout=0.01).timeout == 0.01  # quorum.MIN_LEASE, documented
    with Redlock("short-extend") as lock:
        with pytest.raises(ValueError, match="seconds of a Redlock must be at least"):
            lock.extend(0.005)
        assert lock.owned()
    short = {"REDLOCK": REDLOCK_ALIASES, "TIMEOUT": 0.005}
    with override_settings(REDISLOCK=short):
        with pytest.raises(ImproperlyConfigured, match=r"REDISLOCK\['TIMEOUT'\] of a Redlock"):
            Redlock("default-lease").acquire()
        assert holders(redlock_servers, "default-lease") == [None] * 5


# re-entry: the holder is the thread, whatever handle ------------------------------------


def test_reentrant_per_thread_across_handles(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    outer = Redlock("per-thread")
    with outer:
        token = outer.fencing_token
        begun = time.monotonic()
        with Redlock("per-thread", blocking_timeout=1) as inner:  # does not wait on itself
            assert time.monotonic() - begun < 0.5
            assert inner.owned() and inner.fencing_token == token
            same_servers = Redlock("per-thread", using=list(reversed(REDLOCK_ALIASES)))
            assert same_servers.acquire(blocking=False)
            same_servers.release()
        assert outer.owned()  # the inner levels are gone, the hold is not
        assert refused_elsewhere("per-thread", Redlock, other_thread)
        # three of the five servers are another quorum, so another lock: refused
        assert Redlock("per-thread", using=REDLOCK_ALIASES[:3]).acquire(blocking=False) is False
    assert holders(redlock_servers, "per-thread") == [None] * 5
    assert not outer.owned()


def test_another_thread_still_waits_and_a_handle_is_per_thread(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    shared = Redlock("two-threads", blocking_timeout=0.1)
    with shared:

        def contend() -> None:
            with shared:
                pass

        with pytest.raises(LockTimeout):
            other_thread(contend)
        assert not other_thread(shared.owned)
    assert other_thread(shared.acquire, blocking=False)
    assert not shared.owned()
    other_thread(shared.release)


def test_a_nested_acquire_of_a_lost_hold_reports_it_and_takes_the_lock_afresh(
    redlock_servers: RedlockServers,
) -> None:
    outer = Redlock("lost-nest", auto_renew=False)
    with capture(lock_signals.lock_lost) as lost:
        outer.acquire()
        drop_on_majority(redlock_servers, "lost-nest")
        inner = Redlock("lost-nest")
        assert inner.acquire(blocking=False)
        assert inner.owned()
        inner.release()
        with pytest.raises(LockLostError):
            outer.release()
    assert len(lost) == 1 and "acquired it again" in lost[0]["reason"]
    assert holders(redlock_servers, "lost-nest") == [None] * 5


# aliases that are one server --------------------------------------------------------------


def test_two_aliases_on_one_server_are_refused_at_first_use(
    redlock_servers: RedlockServers,
) -> None:
    from django.conf import settings

    same = redlock_servers.servers[0].url[: -len("/0")] + "/1"  # another db, same server
    caches = {**settings.CACHES, "redlock0-db1": redis_cache(same)}
    aliases = ["redlock0", "redlock0-db1", "redlock1"]
    with override_settings(CACHES=caches):
        with pytest.raises(ImproperlyConfigured, match=r"E023.*'redlock0' and 'redlock0-db1'"):
            Redlock("one-server", using=aliases).acquire(blocking=False)
    assert holders(redlock_servers, "one-server") == [None] * 5


# renewals with a hung server ---------------------------------------------------------


def test_renewals_do_not_wait_out_a_hung_server(redlock_servers: RedlockServers) -> None:
    """Each renewal returns once a majority extended. Waiting out the hung
    server's reply timeout (250 ms) for each hold in turn took a dozen holds
    3 s a pass, twice their 1.5 s lease, and leases lapsed."""
    locks = [Redlock(f"hung-renewals:{i}", timeout=1.5) for i in range(12)]
    for lock in locks:
        assert lock.acquire()
    hung = redlock_servers.servers[0].process
    assert hung is not None
    with capture(lock_signals.lock_lost) as lost:
        hung.send_signal(signal.SIGSTOP)
        try:
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                time.sleep(0.1)  # the subject is two leases' time passing
        finally:
            hung.send_signal(signal.SIGCONT)
        assert [call["name"] for call in lost] == []
    for lock in locks:
        assert lock.owned()
        lock.release()


# a hung minority, split votes and Sentinel deployments (a review of the scale-out layer)


def _no_socket_timeout(servers: RedlockServers) -> Any:
    from django.conf import settings

    return override_settings(
        CACHES={**settings.CACHES, **servers.caches(SOCKET_TIMEOUT=None)},
        REDISLOCK={"REDLOCK": REDLOCK_ALIASES},
    )


def test_inspecting_and_releasing_do_not_wait_out_a_hung_minority(
    redlock_servers: RedlockServers,
) -> None:
    """``locked()`` asked the servers one by one with no reply timeout: with
    no socket timeout one hung server blocked it for ever. ``release()``
    waited for the hung server until the lease ran out."""
    with _no_socket_timeout(redlock_servers):
        lock = Redlock("hung-minority", timeout=6, auto_renew=False)
        assert lock.acquire()
        hung = redlock_servers.servers[0].process
        assert hung is not None
        hung.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # bounded if it blocks
                assert pool.submit(lock.locked).result(timeout=5)
            assert lock.owned()
            assert 2.5 < (lock.ttl() or 0) <= 6  # (each question waits 0.5 s for the hung one)
            lock.release()
            took = time.monotonic() - started
        finally:
            hung.send_signal(signal.SIGCONT)
    assert took < 4.0, f"took {took:.1f} s with one hung server of five (lease 6 s)"


def test_a_split_vote_is_neither_locked_nor_given_a_ttl(redlock_servers: RedlockServers) -> None:
    """Three contenders holding one server each: nobody holds the Redlock."""
    key = "redislock:{split}:redlock"
    for server, token in zip(redlock_servers.servers[:3], ("aa", "bb", "cc"), strict=True):
        with server.client() as client:
            client.set(key, f"{token}:0:1:1:5000:0:h:1:t", px=5000)
    lock = Redlock("split")
    assert not lock.locked()
    assert lock.ttl() is None
    with redlock_servers.servers[3].client() as client:
        client.set(key, "aa:0:1:1:5000:0:h:1:t", px=5000)
    with redlock_servers.servers[4].client() as client:
        client.set(key, "aa:0:1:1:5000:0:h:1:t", px=5000)
    assert lock.locked()  # "aa" on three of five
    assert 4 < (lock.ttl() or 0) <= 5


def test_independent_sentinel_deployments_of_one_service_name_are_not_one_server() -> None:
    from django_redislock.primitives.redlock.servers import shared_server

    def sentinel(*hosts: tuple[str, int]) -> dict[str, Any]:
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://mymaster/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": list(hosts),
            },
        }

    caches = {
        "a": sentinel(("10.0.1.1", 26379), ("10.0.1.2", 26379)),
        "b": sentinel(("10.0.2.1", 26379)),
        "c": sentinel(("10.0.3.1", 26379)),
    }
    assert shared_server(["a", "b", "c"], caches) is None
    caches["c"] = sentinel(("10.0.1.2", 26379), ("10.0.1.1", 26379))  # a's, listed otherwise
    reason = shared_server(["a", "b", "c"], caches)
    assert reason is not None and "'a' and 'c'" in reason and "mymaster" in reason
