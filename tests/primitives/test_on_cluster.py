"""Semaphore, ReadWriteLock, MultiLock and the operator tools on a real Redis Cluster.

Every key of one primitive must share a hash slot (one script touches them
all), while a MultiLock's names land on different primaries.
"""

from __future__ import annotations

import pytest

from django_redislock import MultiLock, ReadWriteLock, Semaphore
from django_redislock.backend import client as lock_backend
from django_redislock.ops.inspection import clear, list_held
from tests.support.other_holders import OtherThread
from tests.support.scaleout import RedisClusterNodes

pytestmark = pytest.mark.scaleout


def slot_of(cluster: RedisClusterNodes, key: str) -> int:
    with cluster.servers[0].client() as client:
        return int(client.execute_command("CLUSTER", "KEYSLOT", key))


@pytest.mark.parametrize("name", ["a{b}c", "x}{y", "{}", "ünï 🔒"])
def test_semaphore_on_the_cluster(cluster_settings: RedisClusterNodes, name: str) -> None:
    first, second, third = (Semaphore(name, 2, auto_renew=False) for _ in range(3))
    assert first.acquire()
    assert second.acquire()
    assert not third.acquire(blocking_timeout=0.1)
    assert len(first.holders()) == 2
    client = lock_backend.get_client("default")
    # (not the dashboard's per-minute history, one key for all names: django_redislock.ops.history)
    keys = [k for k in lock_backend.scan(client, "redislock:*") if b"{~hot}" not in k]
    assert len({slot_of(cluster_settings, k.decode()) for k in keys}) == 1
    first.release()
    assert third.acquire(blocking_timeout=5)
    second.release()
    third.release()


def test_read_write_lock_on_the_cluster(cluster_settings: RedisClusterNodes) -> None:
    rw = ReadWriteLock("doc{7}")
    with rw.read(), ReadWriteLock("doc{7}").read():
        assert not ReadWriteLock("doc{7}").write().acquire(blocking_timeout=0.1)
    with rw.write():
        assert not ReadWriteLock("doc{7}").read().acquire(blocking_timeout=0.1)


def test_multilock_across_slots_and_every_kind_listed(
    cluster_settings: RedisClusterNodes, other_thread: OtherThread
) -> None:
    names = [f"sku:{i}" for i in range(9)]
    slots = {slot_of(cluster_settings, lock_backend.key("redislock", n, "lock")) for n in names}
    assert len(slots) > 1, "the names should spread over several slots"
    cart = MultiLock(names, auto_renew=False)
    overlapping = MultiLock([*reversed(names[4:]), "sku:99"], auto_renew=False)
    semaphore = Semaphore("api", 3, auto_renew=False)
    rw = ReadWriteLock("report", auto_renew=False).read()
    with cart, semaphore, rw:
        assert not other_thread(overlapping.acquire, blocking_timeout=0.1)
        client = lock_backend.get_client("default")
        held = {(h.name, h.kind) for h in list_held(client, "redislock")}
        assert held == {(n, "lock") for n in names} | {("api", "semaphore"), ("report", "rwlock")}
    assert overlapping.acquire(blocking_timeout=5)
    overlapping.release()
    assert list_held(lock_backend.get_client("default"), "redislock") == []


def test_operators_clear_a_semaphore_on_the_cluster(cluster_settings: RedisClusterNodes) -> None:
    holder = Semaphore("jobs{x}", 2, auto_renew=False)
    holder.acquire()
    client = lock_backend.get_client("default")
    assert clear(client, "redislock", "jobs{x}") == 1
    assert list_held(client, "redislock") == []
