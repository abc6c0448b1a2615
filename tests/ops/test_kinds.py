"""A clear confirmed for some holders (``Kind.clear``'s ``confirmed``) clears
only while exactly those hold the name: the comparison is made in the script
that clears, so nothing can take the name between the two."""

from __future__ import annotations

import pytest
import redis

from django_redislock import Lock, LockLostError, ReadWriteLock, Semaphore
from django_redislock.ops.inspection import CHANGED_HANDS, KINDS, LockKind, SemaphoreKind

PREFIX = "redislock"
LOCK, SEMAPHORE, RWLOCK = KINDS[:3]  # the primitives (the Once kinds follow)


def test_a_lock_is_cleared_while_the_confirmed_holder_holds_it(
    redis_client: redis.Redis,
) -> None:
    lock = Lock("sku:1", auto_renew=False)
    assert lock.acquire()
    info = LOCK.describe(redis_client, PREFIX, "sku:1")
    assert info is not None
    assert LOCK.clear(redis_client, PREFIX, "sku:1", confirmed=info) == 1
    assert not redis_client.exists("redislock:{sku:1}:lock")
    with pytest.raises(LockLostError):
        lock.release()


def test_a_lock_that_changed_hands_is_left_to_its_new_holder(redis_client: redis.Redis) -> None:
    first, second = Lock("sku:1", auto_renew=False), Lock("sku:1", auto_renew=False)
    assert first.acquire()
    info = LOCK.describe(redis_client, PREFIX, "sku:1")
    assert info is not None
    first.release()
    assert second.acquire()
    assert LOCK.clear(redis_client, PREFIX, "sku:1", confirmed=info) == CHANGED_HANDS
    assert second.owned()
    second.release()
    # nobody holds it: nothing to clear, and nothing is said to have changed hands
    assert LOCK.clear(redis_client, PREFIX, "sku:1", confirmed=info) == 0


def test_many_locks_answer_each_for_itself(redis_client: redis.Redis) -> None:
    kind = LockKind()
    locks = {name: Lock(name, auto_renew=False) for name in ("a", "b", "c")}
    for lock in locks.values():
        assert lock.acquire()
    confirmed = {}
    for name in locks:
        info = kind.describe(redis_client, PREFIX, name)
        assert info is not None
        confirmed[name] = info
    locks["b"].release()
    taker = Lock("b", auto_renew=False)
    assert taker.acquire()
    locks["c"].release()
    result = kind.clear_many(redis_client, PREFIX, ["a", "b", "c"], confirmed=confirmed)
    assert result == [1, CHANGED_HANDS, 0]
    assert taker.owned()
    taker.release()


@pytest.mark.parametrize(
    "value",
    [
        "ab12:0:1:5:" + "9" * 400 + ":0:host:1:T",  # a lease the tools cannot read
        "zz:1:1:5:30000:0:host:1:T",  # a token that is not hex: read as "zz"
        "ab12:0:1:x:30000:0:host:1:T",  # a fence that is not a number
        "no colons at all",
        "",
    ],
)
def test_a_lock_value_this_version_cannot_read_is_cleared_once_confirmed(
    redis_client: redis.Redis, value: str
) -> None:
    """The script reads the holder's token as the tools do
    (``state.parse_lock_value``): else such a value, shown to the operator,
    could never be cleared with a confirmation."""
    redis_client.set("redislock:{odd}:lock", value)
    info = LOCK.describe(redis_client, PREFIX, "odd")
    assert info is not None
    assert LOCK.clear(redis_client, PREFIX, "odd", confirmed=info) == 1
    assert not redis_client.exists("redislock:{odd}:lock")


def test_a_lock_key_of_another_type_is_cleared_once_confirmed(redis_client: redis.Redis) -> None:
    redis_client.hset("redislock:{odd}:lock", "field", "value")
    info = LOCK.describe(redis_client, PREFIX, "odd")
    assert info is not None
    assert LOCK.clear(redis_client, PREFIX, "odd", confirmed=info) == 1
    assert not redis_client.exists("redislock:{odd}:lock")


def test_a_semaphore_is_cleared_only_while_exactly_its_confirmed_holders_hold_it(
    redis_client: redis.Redis,
) -> None:
    one, two = Semaphore("pool", 2, auto_renew=False), Semaphore("pool", 2, auto_renew=False)
    assert one.acquire() and two.acquire()
    info = SEMAPHORE.describe(redis_client, PREFIX, "pool")
    assert info is not None and len(info.holders) == 2
    two.release()  # one of the two confirmed left: not the holders confirmed
    assert SEMAPHORE.clear(redis_client, PREFIX, "pool", confirmed=info) == CHANGED_HANDS
    three = Semaphore("pool", 2, auto_renew=False)
    assert three.acquire()  # and another came: still not them
    assert SEMAPHORE.clear(redis_client, PREFIX, "pool", confirmed=info) == CHANGED_HANDS
    assert one.owned() and three.owned()
    now = SEMAPHORE.describe(redis_client, PREFIX, "pool")
    assert SEMAPHORE.clear(redis_client, PREFIX, "pool", confirmed=now) == 2
    assert not redis_client.exists("redislock:{pool}:semaphore")
    for permit in (one, three):
        with pytest.raises(LockLostError):
            permit.release()
    assert SEMAPHORE.clear(redis_client, PREFIX, "pool", confirmed=now) == 0


def test_a_read_write_lock_that_changed_hands_is_left_to_its_new_holder(
    redis_client: redis.Redis,
) -> None:
    reader = ReadWriteLock("doc", auto_renew=False).read()
    assert reader.acquire()
    info = RWLOCK.describe(redis_client, PREFIX, "doc")
    assert info is not None
    reader.release()
    writer = ReadWriteLock("doc", auto_renew=False).write()
    assert writer.acquire()
    assert RWLOCK.clear(redis_client, PREFIX, "doc", confirmed=info) == CHANGED_HANDS
    assert writer.owned()
    now = RWLOCK.describe(redis_client, PREFIX, "doc")
    assert RWLOCK.clear(redis_client, PREFIX, "doc", confirmed=now) == 1
    with pytest.raises(LockLostError):
        writer.release()


def test_permit_keys_this_version_cannot_read_are_cleared_once_confirmed(
    redis_client: redis.Redis,
) -> None:
    kind = SemaphoreKind()
    redis_client.set("redislock:{odd}:semaphore", "not a zset")
    info = kind.describe(redis_client, PREFIX, "odd")
    assert info is not None and [h.token for h in info.holders] == [""]
    assert kind.clear(redis_client, PREFIX, "odd", confirmed=info) == 1
    assert not redis_client.exists("redislock:{odd}:semaphore")


def test_without_a_confirmation_whoever_holds_it_is_cleared(redis_client: redis.Redis) -> None:
    first, second = Lock("sku:1", auto_renew=False), Semaphore("pool", 1, auto_renew=False)
    assert first.acquire() and second.acquire()
    assert LOCK.clear(redis_client, PREFIX, "sku:1") == 1
    assert SEMAPHORE.clear(redis_client, PREFIX, "pool") == 1
    assert not first.owned() and not second.owned()
