"""Redlock on five real, independent redis-server processes, some stopped mid-test."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import (
    Lock,
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
    Redlock,
)
from django_redislock import signals as lock_signals
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE
from django_redislock.backend.values import parse_lock_value
from django_redislock.primitives.redlock import fanout
from django_redislock.primitives.redlock.quorum import drift, quorum
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread, refused_elsewhere
from tests.support.procs import processes
from tests.support.renewals import RENEWAL_THREAD
from tests.support.scaleout import REDLOCK_ALIASES, RedlockServers
from tests.support.signals_helper import capture
from tests.support.threads import no_watchdog_thread

pytestmark = pytest.mark.scaleout

KEY = "redislock:{{{}}}:redlock"


def holders(servers: RedlockServers, name: str) -> list[str | None]:
    """The token holding ``name`` on each running server (``None``: free or down)."""
    tokens: list[str | None] = []
    for server in servers.servers:
        if server.process is None or server.process.poll() is not None:
            tokens.append(None)
            continue
        with server.client() as client:
            state = parse_lock_value(client.get(KEY.format(name)))
        tokens.append(state.token if state else None)
    return tokens


def test_quorum_and_drift() -> None:
    assert [quorum(n) for n in (3, 4, 5)] == [2, 3, 3]
    assert drift(10.0) == pytest.approx(0.102)


def test_acquire_writes_every_server_and_release_clears_them(
    redlock_servers: RedlockServers,
) -> None:
    lock = Redlock("order:1")
    assert lock.acquire()
    tokens = holders(redlock_servers, "order:1")
    assert len(set(tokens)) == 1
    assert tokens[0] is not None
    assert lock.locked()
    assert lock.owned()
    ttl = lock.ttl()
    assert ttl is not None
    assert 0 < ttl <= 30
    lock.release()
    assert holders(redlock_servers, "order:1") == [None] * 5
    assert not lock.locked()
    assert lock.ttl() is None


def test_contention_refuses_then_succeeds_after_release(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    first, second = Redlock("x"), Redlock("x")
    assert first.acquire()
    assert other_thread(second.acquire, blocking=False) is False
    assert not other_thread(second.owned)
    # A refused attempt leaves nothing behind on any server.
    assert set(holders(redlock_servers, "x")) == {holders(redlock_servers, "x")[0]}

    def wait_briefly() -> None:
        with Redlock("x", blocking_timeout=0.05):
            pass

    with pytest.raises(LockTimeout) as info:
        other_thread(wait_briefly)
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 30
    first.release()
    assert other_thread(second.acquire, blocking=False)
    other_thread(second.release)


def test_waiter_gets_the_lock_soon_after_release(redlock_servers: RedlockServers) -> None:
    holder = Redlock("w")
    holder.acquire()
    waited: list[float] = []
    released = threading.Event()

    def wait() -> None:
        lock = Redlock("w", blocking_timeout=10)
        assert lock.acquire()
        waited.append(time.monotonic())
        lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.1)  # let the waiter fail its first attempts
    released_at = time.monotonic()
    holder.release()
    released.set()
    thread.join(15)
    assert waited
    assert waited[0] - released_at < 1.0  # polling back-off is capped at RETRY_MAX


def test_minority_holding_does_not_count(redlock_servers: RedlockServers) -> None:
    """Two of five servers held by someone else: still a majority of three."""
    for server in redlock_servers.servers[:2]:
        with server.client() as client:
            client.set(KEY.format("m"), "ff:0:1:1:30000:0:intruder", px=30000)
    lock = Redlock("m")
    assert lock.acquire(blocking=False)
    lock.release()
    for index, server in enumerate(redlock_servers.servers):
        with server.client() as client:
            client.delete(KEY.format("m"))
            if index >= 2:
                client.set(KEY.format("m"), "ff:0:1:1:30000:0:intruder", px=30000)
    assert Redlock("m").acquire(blocking=False) is False
    # The failed attempt released what it had been granted on the two free servers.
    assert holders(redlock_servers, "m")[:2] == [None, None]


def test_reentrant_and_not_owned_errors(redlock_servers: RedlockServers) -> None:
    lock = Redlock("r")
    with pytest.raises(LockNotOwnedError):
        lock.release()
    with lock:
        with lock:
            assert lock.owned()
        assert lock.owned()
    assert not lock.locked()
    with pytest.raises(LockNotOwnedError):
        lock.extend()


def test_one_server_down_still_works(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    redlock_servers.servers[0].kill()
    lock = Redlock("one-down")
    assert lock.acquire(blocking=False)
    assert refused_elsewhere("one-down", Redlock, other_thread)
    lock.extend(20)
    assert lock.fencing_token is not None
    lock.release()


def test_majority_down_is_a_clear_backend_error(redlock_servers: RedlockServers) -> None:
    for server in redlock_servers.servers[:3]:
        server.kill()
    with pytest.raises(LockBackendError, match=r"only 2 of 5 Redis servers answered") as info:
        Redlock("down").acquire()
    assert info.value.__cause__ is not None
    assert holders(redlock_servers, "down") == [None] * 5


def test_servers_stopped_while_held(redlock_servers: RedlockServers) -> None:
    """A holder keeps its lock through the loss of a minority and is told on a majority."""
    lock = Redlock("mid", timeout=1.0)
    with capture(lock_signals.lock_lost) as lost:
        lock.acquire()
        redlock_servers.servers[0].kill()
        redlock_servers.servers[1].kill()
        lock.extend()  # three of five still answer
        assert lock.owned()
        redlock_servers.servers[2].kill()
        with pytest.raises(LockBackendError):
            lock.extend()
        # The watchdog cannot renew on a majority before the lease ends: lost.
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost
        assert lost[0]["kind"] == "redlock"
        with pytest.raises(LockLostError):
            lock.release()


def test_watchdog_keeps_a_short_lease_alive(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    lock = Redlock("long", timeout=1.0)
    with lock:
        time.sleep(3.0)  # three leases
        assert lock.owned()
        assert refused_elsewhere("long", Redlock, other_thread)


def test_lease_lost_without_watchdog_is_reported(redlock_servers: RedlockServers) -> None:
    lock = Redlock("expire", timeout=0.2, auto_renew=False)
    with pytest.raises(LockLostError), lock:
        time.sleep(0.4)
        other = Redlock("expire")
        assert other.acquire(blocking=False)
        other.release()


def test_fencing_tokens_increase_across_holders_and_restarts(
    redlock_servers: RedlockServers,
) -> None:
    tokens = []
    for round_ in range(4):
        lock = Redlock("fence")
        with lock:
            token = lock.fencing_token
            assert token is not None
            assert lock.fencing_token == token  # cached: read once
            tokens.append(token)
        if round_ == 1:  # a server restarts empty: the clock floor keeps the order
            redlock_servers.servers[4].kill()
            redlock_servers.servers[4].start()
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_fencing_token_of_a_lost_lock_is_refused(redlock_servers: RedlockServers) -> None:
    lock = Redlock("lost-fence", auto_renew=False)
    lock.acquire()
    for server in redlock_servers.servers[:3]:
        with server.client() as client:
            client.delete(KEY.format("lost-fence"))
    with pytest.raises(LockLostError):
        _ = lock.fencing_token
    with pytest.raises(LockLostError):
        lock.release()


def test_does_not_collide_with_a_lock_of_the_same_name(redlock_servers: RedlockServers) -> None:
    with override_settings(REDISLOCK={"REDLOCK": REDLOCK_ALIASES, "CACHE": "redlock0"}):
        with Lock("same"), Redlock("same"):
            pass


def test_keys_live_in_the_namespace_of_their_caches(
    redlock_servers: RedlockServers, other_thread: OtherThread
) -> None:
    """Two sites sharing the Redlock servers, told apart by their caches'
    ``KEY_PREFIX`` (SPEC: lock keys live in the cache's namespace), never
    share a Redlock; one site's keys carry its prefix and version on every
    server."""

    def site(prefix: str, version: int = 1) -> Any:
        caches = redlock_servers.caches(SOCKET_TIMEOUT=1.0, KEY_PREFIX=prefix, VERSION=version)
        for config in caches.values():
            config["KEY_PREFIX"], config["VERSION"] = prefix, version
            del config["OPTIONS"]["KEY_PREFIX"], config["OPTIONS"]["VERSION"]  # type: ignore[index]
        return override_settings(CACHES=caches, REDISLOCK={"REDLOCK": REDLOCK_ALIASES})

    with site("shop", 2):
        shop = Redlock("report")
        assert shop.acquire(blocking=False)
    key = "redislock:shop:2:{report}:redlock"
    for server in redlock_servers.servers:
        with server.client() as client:
            assert client.exists(key) == 1
    assert holders(redlock_servers, "report") == [None] * 5  # not the plain prefix
    with site("blog"):
        blog = Redlock("report")
        assert blog.acquire(blocking=False), "the other site's Redlock blocked this one"
        blog.release()
    with site("shop", 2):
        assert refused_elsewhere("report", Redlock, other_thread)
        shop.release()
        for server in redlock_servers.servers:
            with server.client() as client:
                assert client.exists(key) == 0


def test_aliases_whose_caches_disagree_on_a_namespace_are_refused(
    redlock_servers: RedlockServers,
) -> None:
    caches = redlock_servers.caches(SOCKET_TIMEOUT=1.0)
    caches["redlock2"]["KEY_PREFIX"] = "other"
    with override_settings(CACHES=caches, REDISLOCK={"REDLOCK": REDLOCK_ALIASES}):
        with pytest.raises(ImproperlyConfigured, match=r"E025.*'redlock0' and 'redlock2'"):
            Redlock("split").acquire()
        agreeing = Redlock("split", using=["redlock0", "redlock1", "redlock3"])
        assert agreeing.acquire()
        for index, server in enumerate(redlock_servers.servers):
            with server.client() as client:
                assert client.exists(KEY.format("split")) == (index in (0, 1, 3))
        agreeing.release()


def test_an_alias_missing_from_caches_is_named_as_such(redlock_servers: RedlockServers) -> None:
    """Not as a namespace clash with the caches that exist (E025)."""
    caches = redlock_servers.caches(SOCKET_TIMEOUT=1.0)
    for config in caches.values():
        config["KEY_PREFIX"] = "site"
    del caches["redlock2"]
    with override_settings(CACHES=caches, REDISLOCK={"REDLOCK": REDLOCK_ALIASES}):
        for call in (Redlock("gone").acquire, Redlock("gone").locked, Redlock("gone").owned):
            with pytest.raises(ImproperlyConfigured, match="redlock2") as info:
                call()
            assert "E025" not in str(info.value)


def test_configuration_errors(redlock_servers: RedlockServers) -> None:
    with override_settings(REDISLOCK={}), pytest.raises(ImproperlyConfigured, match="at least 3"):
        Redlock("c").acquire()
    with pytest.raises(ValueError, match="at least 3 distinct"):
        Redlock("c", using=["redlock0", "redlock0", "redlock1"])
    with pytest.raises(TypeError, match="list of cache aliases"):
        Redlock("c", using="redlock0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must not be empty"):
        Redlock("")
    with pytest.raises(ValueError, match="timeout"):
        Redlock("c", timeout=float("nan"))
    assert Redlock("c", using=REDLOCK_ALIASES[:3]).acquire()


def test_processes_never_lose_an_update(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three OS processes read-modify-write one counter under the Redlock."""
    urls = ",".join(s.url for s in redlock_servers.servers)
    monkeypatch.setenv("REDISLOCK_TEST_REDLOCK_URLS", urls)
    with processes(_spawned_count, [("procs", 25, "counter")] * 3):
        pass
    with redlock_servers.servers[0].client() as client:
        assert int(client.get("counter") or 0) == 75


def _spawned_count(name: str, rounds: int, key: str) -> None:
    """Entry point in a spawned worker: name the five servers, then count."""
    import os

    import redis as redis_module
    from django.conf import settings

    urls = os.environ["REDISLOCK_TEST_REDLOCK_URLS"].split(",")
    for alias, url in zip(REDLOCK_ALIASES, urls, strict=True):
        settings.CACHES[alias] = redis_cache(url)
    counter = redis_module.Redis.from_url(urls[0])
    for _ in range(rounds):
        with Redlock(name, blocking_timeout=30, using=REDLOCK_ALIASES):
            value = int(counter.get(key) or 0)
            time.sleep(0.001)
            counter.set(key, value + 1)


def test_interrupted_acquire_leaves_nothing_held(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the servers granted it, before the holder knew: all undone."""
    real = fanout.run_on_all
    interrupted: list[bool] = []

    def run_then_interrupt(*args: Any, **kwargs: Any) -> list[Any]:
        results = real(*args, **kwargs)
        if args[1] is LOCK_ACQUIRE and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return results

    monkeypatch.setattr("django_redislock.primitives.redlock.fanout.run_on_all", run_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        Redlock("interrupted").acquire()
    assert interrupted
    assert holders(redlock_servers, "interrupted") == [None] * 5


def test_a_stalled_minority_costs_a_short_reply_timeout_not_the_lease(
    redlock_servers: RedlockServers,
) -> None:
    """A server that accepts the request but never answers (SIGSTOP) must not eat
    the validity the healthy majority granted, nor stall the shared watchdog."""
    lock = Redlock("stalled", timeout=10)
    assert lock.acquire()  # connections to every server are open now
    lock.release()
    stalled = redlock_servers.servers[0].process
    assert stalled is not None
    stalled.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert lock.acquire(blocking_timeout=0)
        took = time.monotonic() - started
        assert took < 2.0, f"acquire waited {took:.2f}s for the stalled server"
        lock.release()
    finally:
        stalled.send_signal(signal.SIGCONT)


def test_decoded_connections_work_too(redlock_servers: RedlockServers) -> None:
    """django-redis shares a pool per URL, so an alias can inherit ``decode_responses``."""
    from django.conf import settings

    decoded = {
        alias: redis_cache(
            f"{server.url}?client_name=decoded", CONNECTION_POOL_KWARGS={"decode_responses": True}
        )
        for alias, server in zip(REDLOCK_ALIASES, redlock_servers.servers, strict=True)
    }
    with override_settings(CACHES={**settings.CACHES, **decoded}):
        lock = Redlock("decoded", timeout=5)
        # connects to every server first (one by one, no reply timeout): CI once
        # stalled past the acquire's 250 ms per-server reply timeout on the five
        # new pools' first connections at once
        assert not lock.locked()
        with lock:
            assert lock.owned()  # used to raise TypeError splitting a str on b":"
            assert lock.locked()
            ttl = lock.ttl()
            assert ttl is not None and 0 < ttl <= 5
            lock.extend(10)
            assert lock.fencing_token is not None
        assert not lock.locked()
        assert not lock.owned()


def test_extend_is_the_lease_the_watchdog_renews(redlock_servers: RedlockServers) -> None:
    lock = Redlock("ext", timeout=3)
    with pytest.raises(ValueError, match="seconds"):
        lock.extend(0.0005)
    with lock:
        with pytest.raises(ValueError, match="seconds"):
            lock.extend(0.0005)
        lock.extend(0.6)
        time.sleep(1.5)  # past the first renewal of the original lease (1 s)
        assert lock.owned()
        seen: list[bool] = []
        other = threading.Thread(target=lambda: seen.append(Redlock("ext").acquire(blocking=False)))
        other.start()
        other.join(30)
        assert seen == [False]
        lock.extend(60)
        time.sleep(0.5)
        ttl = lock.ttl()
        assert ttl is not None and ttl > 50


def test_a_tracer_sees_acquire_and_release_on_every_server(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redlock's fan-out passes ``Redis.execute_command`` (where OpenTelemetry's
    and Sentry's redis integrations hook in) on each server, like every Lock."""
    with Redlock("traced-warm-up"):  # scripts loaded, so one EVALSHA per server
        pass
    seen: list[tuple[int, str]] = []
    mutex = threading.Lock()
    execute = redis.Redis.execute_command

    def traced(self: redis.Redis, *args: Any, **options: Any) -> Any:
        # (the warm-up's release returned at a majority: the rest may come now)
        if args[0] == "EVALSHA" and KEY.format("traced") in map(str, args):
            with mutex:
                seen.append((self.connection_pool.connection_kwargs["port"], args[1]))
        return execute(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", traced)
    lock = Redlock("traced")
    lock.acquire()
    lock.release()
    ports = sorted(server.port for server in redlock_servers.servers)

    def sent(script: Any) -> list[int]:
        with mutex:
            return sorted(port for port, sha in seen if sha == script.sha)

    # a release returns once a majority answered; the others are still sent
    deadline = time.monotonic() + 10
    while len(sent(LOCK_RELEASE)) < len(ports) and time.monotonic() < deadline:
        time.sleep(0.01)
    for script in (LOCK_ACQUIRE, LOCK_RELEASE):
        assert sent(script) == ports


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_fans_out_on_its_own_threads(redlock_servers: RedlockServers) -> None:
    """The parent's worker threads do not exist in a child: it starts its own."""
    from tests.holds.test_fork import fork_and_run

    with Redlock("before-fork"):  # the parent's pool has workers now
        pass

    def child() -> int:
        lock = Redlock("in-child", blocking_timeout=5)
        if not lock.acquire():
            return 2
        lock.release()
        return 0

    assert fork_and_run(child) == 0
    assert holders(redlock_servers, "in-child") == [None] * 5


def test_fan_out_threads_are_daemons_and_exit_when_idle(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("django_redislock.primitives.redlock.fanout.IDLE_EXIT", 0.2)

    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "redislock-fanout"]

    earlier = set(workers())  # other tests' pools (each settings change makes a new one)
    with Redlock("idle"):
        started = [t for t in workers() if t not in earlier]
        assert started
        assert all(t.daemon for t in started)
        assert len(started) <= fanout.WORKERS_PER_SERVER * 5
    for thread in started:
        thread.join(5)
    assert not any(t.is_alive() for t in started)


def test_options_are_fixed_when_the_redlock_is_built() -> None:
    lock = Redlock("fixed", timeout=30, using=["a", "b", "c"])
    for option, value in [("timeout", 5), ("auto_renew", False), ("using", ["x", "y", "z"]),
                          ("blocking", False), ("blocking_timeout", 1), ("name", "x")]:  # fmt: skip
        with pytest.raises(AttributeError, match=rf"Redlock\.{option} is fixed when"):
            setattr(lock, option, value)
    assert (lock.name, lock.timeout, lock.using) == ("fixed", 30, ("a", "b", "c"))


def test_an_extend_crossing_a_renewal_is_the_lease_kept(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that read the old lease and reaches the servers after an extend
    must neither leave the old lease there nor make it the lease from then on."""
    from django_redislock.primitives.redlock import holding as redlock_holding

    read, go, renewed = threading.Event(), threading.Event(), threading.Event()
    lock_call, renew = redlock_holding.lock_call, redlock_holding.RedlockHolding.renew

    def held_back(script: Any, keys: Any, token: str, **kwargs: Any) -> Any:
        if threading.current_thread().name == RENEWAL_THREAD and not go.is_set():
            read.set()  # this renewal has read its lease: send it after the extend
            go.wait(10)
        return lock_call(script, keys, token, **kwargs)

    def observed(self: Any) -> bool:
        try:
            return renew(self)
        finally:
            if go.is_set():
                renewed.set()

    monkeypatch.setattr("django_redislock.primitives.redlock.holding.lock_call", held_back)
    monkeypatch.setattr(
        "django_redislock.primitives.redlock.holding.RedlockHolding.renew", observed
    )
    try:
        with Redlock("crossed", timeout=3) as lock:
            assert read.wait(10)
            lock.extend(60)
            go.set()
            assert renewed.wait(10)
            ttl = lock.ttl()
            assert ttl is not None and ttl > 50, f"the old lease is back: {ttl} s"
            holding = lock._holding()
            assert holding is not None and holding.lease == 60
    finally:
        go.set()


def test_an_acquire_that_no_thread_would_renew_fails_before_any_grant(
    redlock_servers: RedlockServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for Lock: with no watchdog thread and none that can start, an
    auto-renewed Redlock fails before any server grants it."""
    no_watchdog_thread(monkeypatch)
    with pytest.raises(LockError, match="could not start the thread that renews leases"):
        Redlock("unrenewed").acquire()
    assert not any(holders(redlock_servers, "unrenewed"))  # no server granted it
    monkeypatch.undo()
    lock = Redlock("unrenewed")
    assert lock.acquire()
    lock.release()
