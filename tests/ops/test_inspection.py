from __future__ import annotations

import redis

from django_redislock import Lock
from django_redislock.ops.inspection import clear, describe, list_held


def test_list_and_describe_held_lock(redis_client: redis.Redis) -> None:
    with Lock("sku:1") as lock, Lock("a{b}*c"):
        held = list_held(redis_client, "redislock")
        assert [(h.name, h.kind) for h in held] == [("a{b}*c", "lock"), ("sku:1", "lock")]
        info = describe(redis_client, "redislock", "sku:1")[0]
        assert info.fencing_token is None  # none taken yet: taken on first use
        token = lock.fencing_token
        info = describe(redis_client, "redislock", "sku:1")[0]
        assert info.fencing_token == token
        assert info.holders[0].ttl is not None
        assert ":" in info.holders[0].holder
        assert [h.name for h in list_held(redis_client, "redislock", pattern="sku:*")] == ["sku:1"]


def test_clear_is_literal_and_holder_learns(redis_client: redis.Redis) -> None:
    star, other = Lock("a*", auto_renew=False), Lock("abc")
    star.acquire()
    other.acquire()
    assert clear(redis_client, "redislock", "a*") == 1
    assert other.owned()
    assert not star.owned()
    other.release()


def test_holders_carry_since_for_held_for(redis_client: redis.Redis) -> None:
    import time

    from django_redislock import Semaphore

    before = time.time()
    with Lock("held"), Semaphore("pool", 2):
        lock = describe(redis_client, "redislock", "held")[0].holders[0]
        permit = describe(redis_client, "redislock", "pool")[0].holders[0]
    for holder in (lock, permit):
        assert holder.since is not None
        assert before - 1 <= holder.since <= time.time() + 1
