"""Lock, AsyncLock and the inspection layer on a real three-primary Redis Cluster."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockLostError
from django_redislock.backend import client as lock_backend
from django_redislock.cluster import ClusterClient, parse_startup_nodes
from django_redislock.ops.inspection import clear, describe, list_held
from django_redislock.primitives.lock_common import LockBase
from tests.support.other_holders import OtherThread
from tests.support.procs import processes
from tests.support.scaleout import RedisClusterNodes, cluster_cache

pytestmark = pytest.mark.scaleout

#: Names chosen to break naive hash tags: braces anywhere, empty tags, spaces, unicode.
AWKWARD_NAMES = [
    "a{b}c",
    "{}",
    "x}{y",
    "{sku:1}",
    "}",
    "{",
    "with space",
    "ünïcødé 锁 🔒",
    "%7B",
    "a%7Bb",
    "{{}}",
    "sku:42",
]


def primary_for(cluster: RedisClusterNodes, key: str) -> int:
    """Index of the server that owns ``key``'s slot."""
    with cluster.servers[0].client() as client:
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
    return min(slot * len(cluster.servers) // 16384, len(cluster.servers) - 1)


def lock_key(name: str) -> str:
    return lock_backend.key("redislock", name, "lock")


def keyslots(cluster: RedisClusterNodes, keys: list[str]) -> set[int]:
    with cluster.servers[0].client() as client:
        return {int(client.execute_command("CLUSTER", "KEYSLOT", k)) for k in keys}


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_every_key_of_a_lock_shares_one_slot(
    cluster_settings: RedisClusterNodes, name: str, other_thread: OtherThread
) -> None:
    keys = [lock_backend.key("redislock", name, part) for part in LockBase.parts]
    keys.append(lock_backend.key("redislock", name, "signal:") + "0123abcd")
    assert len(keyslots(cluster_settings, keys)) == 1
    lock = Lock(name)
    with lock:
        assert lock.locked()
        assert lock.owned()
        assert other_thread(Lock(name).acquire, blocking=False) is False
    assert not lock.locked()


def test_backend_client_is_a_cluster_client(cluster_settings: RedisClusterNodes) -> None:
    client = lock_backend.get_client("default")
    assert isinstance(client, redis.cluster.RedisCluster)
    # Shared by every django-redis client with these settings in the process.
    from django.core.cache import caches

    assert caches["default"].client.get_client(write=True) is client


def test_names_spread_over_every_primary(cluster_settings: RedisClusterNodes) -> None:
    names = [f"sku:{i}" for i in range(30)]
    owners = {
        primary_for(cluster_settings, lock_backend.key("redislock", n, "lock")) for n in names
    }
    assert owners == {0, 1, 2}
    locks = [Lock(n) for n in names]
    for lock in locks:
        assert lock.acquire(blocking=False)
    tokens = [lock.fencing_token for lock in locks]
    assert all(t is not None for t in tokens)
    for lock in locks:
        lock.release()
    assert not any(lock.locked() for lock in locks)


def test_scripts_are_reloaded_on_each_node_after_script_flush(
    cluster_settings: RedisClusterNodes,
) -> None:
    names = [f"flush:{i}" for i in range(12)]
    for lock in (Lock(n) for n in names):
        with lock:
            pass
    for server in cluster_settings.servers:
        with server.client() as client:
            client.script_flush()
    for lock in (Lock(n) for n in names):
        with lock:
            assert lock.owned()


def test_waiter_is_woken_by_release_on_the_slot_node(cluster_settings: RedisClusterNodes) -> None:
    """The release script pushes the waiter's undeclared signal key; BLPOP is routed to it."""
    for name in ("handoff:a{b}c", "handoff:x}{y", "handoff:3"):
        holder = Lock(name)
        holder.acquire()
        got: list[float] = []

        def wait(name: str = name, got: list[float] = got) -> None:
            lock = Lock(name, blocking_timeout=10)
            assert lock.acquire()
            got.append(time.monotonic())
            lock.release()

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 5
        queue_key = lock_backend.key("redislock", name, "queue")
        client = lock_backend.get_client("default")
        while not client.zcard(queue_key) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.zcard(queue_key) == 1
        released = time.monotonic()
        holder.release()
        thread.join(10)
        assert got
        # Woken by the signal, not by the 2 s fallback chunk.
        assert got[0] - released < 1.0


def test_fencing_tokens_increase(topology: str) -> None:
    """Also an example of ``topology``: runs on one server, then on the cluster."""
    tokens = []
    for _ in range(5):
        with Lock("fence{x}") as lock:
            tokens.append(lock.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 5


def test_inspection_lists_and_clears_across_every_primary(
    cluster_settings: RedisClusterNodes,
) -> None:
    names = [f"held:{i}" for i in range(12)] + ["a{b}c", "{}", "x}{y"]
    owners = {
        primary_for(cluster_settings, lock_backend.key("redislock", n, "lock")) for n in names
    }
    assert owners == {0, 1, 2}
    locks = [Lock(n, auto_renew=False) for n in names]
    for lock in locks:
        lock.acquire()
    token = locks[-1].fencing_token  # taken on first use, on the name's own node
    client = lock_backend.get_client("default")
    held = list_held(client, "redislock")
    assert sorted(h.name for h in held) == sorted(names)
    assert {h.kind for h in held} == {"lock"}
    info = describe(client, "redislock", "x}{y")[0]
    assert info.fencing_token == token
    assert [h.name for h in list_held(client, "redislock", pattern="held:1*")] == sorted(
        n for n in names if n.startswith("held:1")
    )
    for name in names:
        assert clear(client, "redislock", name) == 1
    assert list_held(client, "redislock") == []
    with pytest.raises(LockLostError):
        locks[0].release()


def test_async_lock_on_the_cluster(cluster_settings: RedisClusterNodes) -> None:
    async def main() -> list[int | None]:
        tokens: list[int | None] = []
        lock = AsyncLock("async{1}")
        async with lock:
            tokens.append(lock.fencing_token)
            assert await lock.owned()
            assert not await asyncio.create_task(AsyncLock("async{1}").acquire(blocking=False))
        holder = AsyncLock("async{1}")
        await holder.acquire()

        async def wait() -> int | None:
            waiter = AsyncLock("async{1}", blocking_timeout=5)
            assert await waiter.acquire()
            token = waiter.fencing_token
            await waiter.release()
            return token

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.1)
        await holder.release()
        tokens.append(await task)
        return tokens

    tokens = asyncio.run(main())
    assert tokens[0] is not None
    assert tokens[1] is not None
    assert tokens[1] > tokens[0]


def test_processes_never_lose_an_update_on_the_cluster(
    cluster_settings: RedisClusterNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDISLOCK_TEST_CLUSTER_URLS", ",".join(cluster_settings.urls))
    with processes(_spawned_count, [("count{x}", 30)] * 3):
        pass
    client = lock_backend.get_client("default")
    assert int(client.get("counter{x}") or 0) == 90


def _spawned_count(name: str, rounds: int) -> None:
    import os

    from django.conf import settings

    settings.CACHES["default"] = cluster_cache(os.environ["REDISLOCK_TEST_CLUSTER_URLS"].split(","))
    client = lock_backend.get_client("default")
    for _ in range(rounds):
        with Lock(name, blocking_timeout=30):
            value = int(client.get("counter{x}") or 0)
            time.sleep(0.001)
            client.set("counter{x}", value + 1)


def test_cluster_client_options_and_errors(redis_cluster: RedisClusterNodes) -> None:
    assert parse_startup_nodes("redis://h1:7000,redis://h2:7001/0") == [("h1", 7000), ("h2", 7001)]
    with pytest.raises(ImproperlyConfigured, match="only database 0"):
        parse_startup_nodes(["redis://h1:7000/3"])
    with pytest.raises(ImproperlyConfigured, match="redis://host:port"):
        parse_startup_nodes(["h1:7000"])
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        parse_startup_nodes([])
    caches = {"default": cluster_cache(redis_cluster.urls, SOCKET_TIMEOUT=0.5)}
    with override_settings(CACHES=caches):
        client = lock_backend.get_client("default")
        assert lock_backend.wait_chunk(client) == pytest.approx(0.25)
        assert issubclass(ClusterClient, object)


def test_system_check_reports_a_bad_cluster_location() -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://127.0.0.1:7000/2"],
            "OPTIONS": {"CLIENT_CLASS": "django_redislock.cluster.ClusterClient"},
        }
    }
    with override_settings(CACHES=caches):
        ids = [m.id for m in run_checks()]
    assert "django_redislock.E020" in ids


def test_a_bad_cluster_kwargs_gets_a_hint_about_cluster_kwargs() -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://127.0.0.1:7000"],
            "OPTIONS": {
                "CLIENT_CLASS": "django_redislock.cluster.ClusterClient",
                "CLUSTER_KWARGS": 5,
            },
        }
    }
    with override_settings(CACHES=caches):
        found = [m for m in run_checks() if m.id == "django_redislock.E020"]
    assert len(found) == 1
    assert "CLUSTER_KWARGS" in found[0].msg and "CLUSTER_KWARGS" in str(found[0].hint)
    assert "LOCATION" not in str(found[0].hint)


def test_a_cluster_no_node_of_which_answers_is_a_backend_error() -> None:
    """redis-py raises ``RedisClusterException`` (no ``RedisError``) when it
    cannot reach any startup node: the primitives' error is ``LockBackendError``
    all the same, as for any Redis that cannot be reached."""
    from django_redislock import LockBackendError
    from tests.support.servers import free_port

    caches = {
        "default": cluster_cache(
            [f"redis://127.0.0.1:{free_port()}"], SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5
        )
    }
    with override_settings(CACHES=caches):
        with pytest.raises(LockBackendError, match="unreachable for lock 'nowhere'"):
            Lock("nowhere", blocking_timeout=1).acquire()
        with pytest.raises(LockBackendError):
            Lock("nowhere").locked()
        with pytest.raises(LockBackendError):
            asyncio.run(AsyncLock("nowhere", blocking_timeout=1).acquire())


def test_renewals_sharing_a_slot_go_in_one_call_the_others_alone(
    cluster_settings: RedisClusterNodes,
) -> None:
    """On a Redis Cluster one call carries only keys of one hash slot: the
    renewals of names in one slot go together, each other one alone."""
    import weakref

    from redis.cluster import RedisCluster
    from redis.crc import key_slot

    from django_redislock.backend.scripts import LOCK_EXTEND, LOCK_RENEW
    from django_redislock.holds.renewals import renew_all

    by_slot: dict[int, list[str]] = {}
    for i in range(50_000):
        name = f"slotted:{i}"
        group = by_slot.setdefault(key_slot(lock_key(name).encode()), [])
        group.append(name)
        if len(group) == 3:
            break
    together = group
    apart = [f"apart:{i}" for i in range(2)]
    locks = [Lock(name, timeout=30, auto_renew=False) for name in [*together, *apart]]
    for lock in locks:
        assert lock.acquire()
    holdings = [lock._holding() for lock in locks]
    for holding in holdings:
        assert holding is not None
        holding.lease = 50.0
    client = holdings[0].client  # type: ignore[union-attr]
    for script in (LOCK_EXTEND, LOCK_RENEW):
        client.script_load(script.text)  # on every primary: no NOSCRIPT resend below
    sent: list[int] = []
    execute = RedisCluster.execute_command

    def traced(self: RedisCluster, *args: object, **options: object) -> object:
        if str(args[0]).upper() == "EVALSHA":
            sent.append(int(args[2]))  # type: ignore[call-overload]
        return execute(self, *args, **options)

    RedisCluster.execute_command = traced  # type: ignore[method-assign]
    try:
        results = list(renew_all([weakref.ref(h) for h in holdings if h is not None]))
    finally:
        RedisCluster.execute_command = execute  # type: ignore[method-assign]
    try:
        assert [outcome for _, _, outcome in results] == [True] * 5
        assert sorted(sent) == [1, 1, 3]
        for lock in locks:
            assert client.pttl(lock_key(lock.name)) > 40_000
    finally:
        for lock in locks:
            lock.release()
