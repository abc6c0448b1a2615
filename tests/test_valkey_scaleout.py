"""Locks through django-valkey's cluster cache and Sentinel client, on real
servers: the same guarantees as through django-redis (``test_cluster.py``,
``test_sentinel.py``), on valkey-py's ``ValkeyCluster`` and Sentinel pools."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import valkey
import valkey.cluster
import valkey.sentinel
from django.test import override_settings

from django_redislock import AsyncLock, Lock, Semaphore
from django_redislock.backend import client as lock_backend
from django_redislock.ops.inspection import list_held
from tests.support.other_holders import OtherThread
from tests.support.scaleout import SENTINEL_SERVICE, RedisClusterNodes, SentinelGroup

pytestmark = pytest.mark.scaleout

TIMEOUTS = {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5}


@pytest.fixture
def valkey_cluster(redis_cluster: RedisClusterNodes) -> Iterator[RedisClusterNodes]:
    """The ``default`` cache is django-valkey's ``ClusterValkeyCache`` on the cluster."""
    redis_cluster.flush()
    cache = {
        "BACKEND": "django_valkey.cluster_cache.cache.ClusterValkeyCache",
        "LOCATION": redis_cluster.urls[0],  # one startup node: the rest is discovered
        "OPTIONS": TIMEOUTS,
    }
    with override_settings(CACHES={"default": cache}):
        yield redis_cluster


def test_locks_on_a_django_valkey_cluster_cache(
    valkey_cluster: RedisClusterNodes, other_thread: OtherThread
) -> None:
    client = lock_backend.get_client("default")
    assert isinstance(client, valkey.cluster.ValkeyCluster)
    assert lock_backend.is_cluster(client)
    names = [f"vk:{i}" for i in range(12)] + ["a{b}c", "{}"]
    holders = [Lock(name, timeout=5) for name in names]
    for name, holder in zip(names, holders, strict=True):
        assert holder.acquire()
        assert not other_thread(lambda n=name: Lock(n).acquire(blocking=False))
    assert {h.name for h in list_held(client, "redislock")} == set(names)  # SCAN on every primary
    client.script_flush()  # every node: the scripts are loaded again where needed
    for holder in holders:
        holder.release()
    with Semaphore("vk-sem", 2):
        pass
    assert list_held(client, "redislock") == []


def test_a_waiter_on_a_django_valkey_cluster_is_handed_the_lock(
    valkey_cluster: RedisClusterNodes,
) -> None:
    holder = Lock("vk-handoff{x}", timeout=5)
    assert holder.acquire()
    got: list[int] = []
    started = threading.Event()

    def wait() -> None:
        waiter = Lock("vk-handoff{x}", timeout=5, blocking_timeout=10)
        started.set()
        with waiter:
            got.append(waiter.fencing_token)

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(5)
    holder.release()
    thread.join(10)
    assert got


def test_async_lock_on_a_django_valkey_cluster(valkey_cluster: RedisClusterNodes) -> None:
    async def main() -> None:
        lock = AsyncLock("vk-async", timeout=5)
        async with lock:
            assert await lock.locked()
        assert not await lock.locked()

    asyncio.run(main())


def sentinel_cache(group: SentinelGroup, client: str = "SentinelClient") -> dict[str, Any]:
    return {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": f"valkey://{SENTINEL_SERVICE}/0",
        "OPTIONS": {
            "CLIENT_CLASS": f"django_valkey.client.{client}",
            "SENTINELS": group.addresses,
            **TIMEOUTS,
        },
    }


@pytest.fixture
def valkey_sentinel(sentinel_group: SentinelGroup) -> Iterator[SentinelGroup]:
    with override_settings(CACHES={"default": sentinel_cache(sentinel_group)}):
        yield sentinel_group
    from django_valkey.base_pool import BaseConnectionFactory

    for url in [u for u in BaseConnectionFactory._pools if SENTINEL_SERVICE in u]:
        BaseConnectionFactory._pools.pop(url).disconnect()


def test_locks_through_django_valkey_s_sentinel_client(
    valkey_sentinel: SentinelGroup, other_thread: OtherThread
) -> None:
    client = lock_backend.get_client("default")
    assert isinstance(client.connection_pool, valkey.sentinel.SentinelConnectionPool)
    lock = Lock("vk-sentinel", timeout=5)
    assert lock.acquire()
    first = lock.fencing_token
    assert not other_thread(lambda: Lock("vk-sentinel").acquire(blocking=False))
    lock.release()
    with Lock("vk-sentinel") as again:
        assert again.fencing_token > first
    with valkey_sentinel.primary.client() as primary:  # the primary the sentinels name
        assert primary.exists(lock_backend.key("redislock", "vk-sentinel", "fence"))

    async def main() -> None:  # no plain pool to mirror: the sync client on a thread
        async with AsyncLock("vk-sentinel-async", timeout=5) as held:
            assert await held.owned()

    asyncio.run(main())
