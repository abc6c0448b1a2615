from __future__ import annotations

import asyncio
import time

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import AsyncLock, Lock
from django_redislock.conf import DEFAULTS, get_settings
from django_redislock.holds.watchdog import watchdog
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread

#: Built before any override, as a module-level lock in a project would be.
IMPORT_TIME_LOCK = Lock("import-time")


def watched(lock: Lock) -> bool:
    holding = lock._holding()
    with watchdog._lock:
        watchdog._admit()
        return holding is not None and id(holding) in watchdog._watched


def test_defaults() -> None:
    settings = get_settings()
    assert settings.cache == DEFAULTS["CACHE"] == "default"
    assert settings.key_prefix == "redislock"
    assert settings.timeout == 30.0
    assert settings.blocking_timeout == 10.0
    assert settings.auto_renew is True
    assert settings.redlock == ()


@pytest.mark.parametrize(
    ("redislock", "mentions"),
    [
        ({"TIMEOUT": -1}, "django_redislock.E006"),
        ({"TIMEOUTS": 5}, "TIMEOUTS"),
        ("not a dict", "django_redislock.E001"),
        ({"KEY_PREFIX": "a{b}"}, "KEY_PREFIX"),
    ],
)
def test_bad_settings_raise_improperly_configured_at_first_use(
    redislock: object, mentions: str
) -> None:
    lock = Lock("x")  # construction never reads settings
    with override_settings(REDISLOCK=redislock):
        with pytest.raises(ImproperlyConfigured) as info:
            lock.acquire()
    assert mentions in str(info.value)


def test_unknown_cache_alias_at_first_use() -> None:
    with override_settings(REDISLOCK={"CACHE": "nope"}):
        with pytest.raises(ImproperlyConfigured, match="'nope' is not defined in CACHES"):
            Lock("x").acquire()
    with pytest.raises(ImproperlyConfigured, match="'other'"):
        Lock("x", using="other").acquire()


def test_locmem_cache_is_improperly_configured_not_a_redis_trace() -> None:
    with override_settings(REDISLOCK={"CACHE": "locmem"}):
        with pytest.raises(ImproperlyConfigured) as info:
            Lock("x").acquire()
    message = str(info.value)
    assert "'locmem'" in message and "LocMemCache" in message and "not Redis-backed" in message
    with pytest.raises(ImproperlyConfigured, match="'locmem'"):
        Lock("x", using="locmem").locked()


def test_override_settings_takes_effect_on_a_lock_built_earlier(
    redis_client: redis.Redis,
) -> None:
    with override_settings(REDISLOCK={"KEY_PREFIX": "shop", "TIMEOUT": 7, "AUTO_RENEW": False}):
        with IMPORT_TIME_LOCK:
            assert redis_client.exists("shop:{import-time}:lock")
            ttl = IMPORT_TIME_LOCK.ttl()
            assert ttl is not None and 5 < ttl <= 7
            assert not watched(IMPORT_TIME_LOCK)
    with IMPORT_TIME_LOCK:  # back to the defaults
        assert redis_client.exists("redislock:{import-time}:lock")
        ttl = IMPORT_TIME_LOCK.ttl()
        assert ttl is not None and 25 < ttl <= 30
        assert watched(IMPORT_TIME_LOCK)


def test_blocking_timeout_setting_and_its_per_call_override(other_thread: OtherThread) -> None:
    holder = Lock("busy")
    other_thread(holder.acquire)
    try:
        with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0.1}):
            started = time.monotonic()
            assert not Lock("busy").acquire()
            assert time.monotonic() - started < 5
        with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0}):
            assert not Lock("busy").acquire()
        # the lock's own blocking_timeout wins over the setting
        with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": None}):
            assert not Lock("busy", blocking_timeout=0.05).acquire()
    finally:
        other_thread(holder.release)


def test_cache_setting_picks_the_alias(redis_client: redis.Redis, redis_url: str) -> None:
    other_db = redis_url.rsplit("/", 1)[0] + "/3"
    caches = {"default": redis_cache(redis_url), "locks": redis_cache(other_db)}
    with override_settings(CACHES=caches, REDISLOCK={"CACHE": "locks"}), Lock("db3"):
        assert not redis_client.exists("redislock:{db3}:lock")
        other = redis.Redis.from_url(other_db)
        assert other.exists("redislock:{db3}:lock")
        other.close()


def test_djangos_builtin_redis_cache_works_as_the_backend(
    redis_url: str, other_thread: OtherThread
) -> None:
    builtin = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}
    with override_settings(CACHES={"default": builtin}):
        lock = Lock("builtin", timeout=5)
        with lock:
            assert lock.owned()
            assert not other_thread(Lock("builtin").acquire, blocking=False)
        assert not lock.locked()

        async def main() -> None:
            async with AsyncLock("builtin-async") as alock:
                assert await alock.owned()

        asyncio.run(main())


def test_settings_are_resolved_once_and_again_when_they_change(redis_client: redis.Redis) -> None:
    from django_redislock import conf

    lock = Lock("resolved")
    first = conf.get_settings()
    assert conf.get_settings() is first  # resolved once, not per call
    with lock:
        assert redis_client.exists("redislock:{resolved}:lock")
    before = conf.generation()
    with override_settings(REDISLOCK={"KEY_PREFIX": "elsewhere"}):
        assert conf.generation() > before  # setting_changed dropped it
        assert conf.get_settings().key_prefix == "elsewhere"
        with lock:  # the same object follows the new settings
            assert redis_client.exists("elsewhere:{resolved}:lock")
    with override_settings(DEBUG=True):  # other settings keep the resolution
        assert conf.get_settings() is conf.get_settings()
        generation = conf.generation()
    assert conf.generation() == generation
    with lock:
        assert redis_client.exists("redislock:{resolved}:lock")
