"""Every check id listed in ``docs/checks.md`` is triggered here, by id, with a hint."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import CheckMessage, Error, Warning, run_checks
from django.test import override_settings
from django_redis.cache import RedisCache

from django_redislock.checks import check_settings
from tests.settings import redis_cache
from tests.support.servers import free_port

DOCS = Path(__file__).resolve().parent.parent / "docs" / "checks.md"


class SubclassedRedisCache(RedisCache):
    """A project's own subclass of django-redis's cache is still Redis."""


def caches(**extra: dict[str, Any]) -> dict[str, Any]:
    # Unreachable ports: checks must never connect to Redis. One server per
    # alias, as REDLOCK needs (E023): free_port never hands out one port twice
    # in a row.
    def url() -> str:
        return f"redis://127.0.0.1:{free_port()}/0"

    return {
        "default": redis_cache(url()),
        "r1": redis_cache(url()),
        "r2": redis_cache(url()),
        "r3": redis_cache(url()),
        "r4": redis_cache(url()),
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        **extra,
    }


def check(redislock: object, **extra_caches: dict[str, Any]) -> list[CheckMessage]:
    with override_settings(REDISLOCK=redislock, CACHES=caches(**extra_caches)):
        return check_settings()


def ids(messages: list[CheckMessage]) -> list[str]:
    return [str(m.id) for m in messages]


def test_every_documented_id_is_tested() -> None:
    documented = set(re.findall(r"`django_redislock\.([EW]\d{3})`", DOCS.read_text()))
    source = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
    tested = set(re.findall(r'\b([EW]\d{3})"', source))
    assert documented, "no ids found in docs/checks.md"
    assert documented <= tested, f"untested check ids: {sorted(documented - tested)}"


def test_defaults_and_valid_settings_pass() -> None:
    assert check({}) == []
    valid = {
        "CACHE": "default",
        "KEY_PREFIX": "shop:locks",
        "TIMEOUT": 5,
        "BLOCKING_TIMEOUT": None,
        "AUTO_RENEW": False,
        "REDLOCK": ["r1", "r2", "r3"],
        "RENEWAL_BATCH": 1,
    }
    assert check(valid) == []


def test_missing_redislock_setting_is_fine() -> None:
    with override_settings(CACHES=caches()):
        from django.conf import settings

        del settings.REDISLOCK
        assert check_settings() == []


def test_redislock_none_is_the_defaults_for_the_check_as_for_the_primitives() -> None:
    from django_redislock.conf import get_settings

    with override_settings(CACHES=caches(), REDISLOCK=None):
        assert check_settings() == []
        assert get_settings().timeout == 30.0


@pytest.mark.parametrize(
    ("redislock", "check_id", "mentions"),
    [
        ("redislock", "E001", "must be a dict"),
        (["CACHE"], "E001", "not list"),
        ({"TIMEOUTS": 5}, "E002", "TIMEOUTS"),
        ({"CACHE": ""}, "E003", "CACHE"),
        ({"CACHE": 3}, "E003", "CACHE"),
        ({"CACHE": "nope"}, "E003", "'nope'"),
        ({"CACHE": "locmem"}, "E004", "LocMemCache"),
        ({"CACHE": "bad_path"}, "E004", "no.such.Backend"),
        ({"KEY_PREFIX": ""}, "E005", "KEY_PREFIX"),
        ({"KEY_PREFIX": "a{b}"}, "E005", "KEY_PREFIX"),
        ({"KEY_PREFIX": "locks*"}, "E005", "KEY_PREFIX"),
        ({"KEY_PREFIX": 7}, "E005", "KEY_PREFIX"),
        ({"TIMEOUT": 0}, "E006", "TIMEOUT"),
        ({"TIMEOUT": -1}, "E006", "TIMEOUT"),
        ({"TIMEOUT": math.nan}, "E006", "TIMEOUT"),
        ({"TIMEOUT": math.inf}, "E006", "TIMEOUT"),
        ({"TIMEOUT": 0.0005}, "E006", "TIMEOUT"),
        ({"TIMEOUT": 1e16}, "E006", "TIMEOUT"),
        ({"TIMEOUT": "30"}, "E006", "TIMEOUT"),
        ({"TIMEOUT": True}, "E006", "TIMEOUT"),
        ({"BLOCKING_TIMEOUT": -1}, "E007", "BLOCKING_TIMEOUT"),
        ({"BLOCKING_TIMEOUT": math.inf}, "E007", "BLOCKING_TIMEOUT"),
        ({"BLOCKING_TIMEOUT": "10"}, "E007", "BLOCKING_TIMEOUT"),
        ({"AUTO_RENEW": "yes"}, "E008", "AUTO_RENEW"),
        ({"AUTO_RENEW": 1}, "E008", "AUTO_RENEW"),
        ({"REDLOCK": "r1,r2,r3"}, "E009", "REDLOCK"),
        ({"REDLOCK": ["r1", 2, "r3"]}, "E009", "REDLOCK"),
        ({"REDLOCK": ["r1", "r2"]}, "E010", "at least 3"),
        ({"REDLOCK": ["r1", "r1", "r2"]}, "E010", "distinct"),
        ({"REDLOCK": ["r1", "r2", "missing"]}, "E011", "'missing'"),
        ({"REDLOCK": ["r1", "r2", "locmem"]}, "E004", "locmem"),
        ({"STATS": -1}, "E012", "STATS"),
        ({"RENEWAL_BATCH": 0}, "E026", "RENEWAL_BATCH"),
        ({"RENEWAL_BATCH": 10_001}, "E026", "RENEWAL_BATCH"),
        ({"RENEWAL_BATCH": 2.5}, "E026", "RENEWAL_BATCH"),
        ({"RENEWAL_BATCH": True}, "E026", "RENEWAL_BATCH"),
    ],
)
def test_each_problem_is_reported_by_id_with_a_hint(
    redislock: object, check_id: str, mentions: str
) -> None:
    messages = check(redislock, bad_path={"BACKEND": "no.such.Backend"})
    assert ids(messages) == [f"django_redislock.{check_id}"]
    (message,) = messages
    assert isinstance(message, Error)
    assert mentions in message.msg
    if check_id != "E008":  # the message says all there is to say
        assert message.hint


def test_even_number_of_redlock_aliases_warns_w001() -> None:
    messages = check({"REDLOCK": ["r1", "r2", "r3", "r4"]})
    assert ids(messages) == ["django_redislock.W001"]
    assert isinstance(messages[0], Warning)
    assert messages[0].hint and "odd" in messages[0].hint


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1"),  # another db: same server
        ("redis://localhost:7001/0", "rediss://127.0.0.1:7001/2"),
        ("redis://10.0.0.1/0", "redis://10.0.0.1:6379"),  # the default port
        ("unix:///run/redis.sock?db=0", "unix:///run/../run/redis.sock?db=3"),
        (["redis://10.0.0.1:7001/0", "redis://10.0.0.9:7001/0"], "redis://10.0.0.1:7001/1"),
    ],
)
def test_two_redlock_aliases_on_one_server_are_an_error_e023(first: Any, second: Any) -> None:
    messages = check(
        {"REDLOCK": ["one", "r1", "other"]},
        one=redis_cache(first),
        other=redis_cache(second),
    )
    assert ids(messages) == ["django_redislock.E023"]
    assert "'one' and 'other'" in messages[0].msg
    assert "separate redis-server" in str(messages[0].hint)


def test_redlock_aliases_on_separate_servers_pass_e023() -> None:
    locations = ["redis://10.0.0.1:7001/0", "redis://10.0.0.2:7001/0", "redis://10.0.0.1:7002"]
    extra = {f"s{i}": redis_cache(url) for i, url in enumerate(locations)}
    assert check({"REDLOCK": list(extra)}, **extra) == []
    socket = {"s3": redis_cache("unix:///run/a.sock"), "s4": redis_cache("unix:///run/b.sock")}
    assert check({"REDLOCK": ["s3", "s4", "r1"]}, **socket) == []


def test_redlock_aliases_in_different_namespaces_are_an_error_e025() -> None:
    prefixed = {f"p{i}": {**redis_cache(f"redis://10.0.0.{i}:6379/0"), "KEY_PREFIX": "shop"}
                for i in (1, 2, 3)}  # fmt: skip
    assert check({"REDLOCK": list(prefixed)}, **prefixed) == []
    prefixed["p3"]["VERSION"] = 2
    messages = check({"REDLOCK": list(prefixed)}, **prefixed)
    assert ids(messages) == ["django_redislock.E025"]
    assert "'p1' and 'p3'" in messages[0].msg
    assert "'redislock:shop:1' and 'redislock:shop:2'" in messages[0].msg
    messages = check({"REDLOCK": ["r1", "p1", "r2"]}, **prefixed)  # one without a prefix
    assert ids(messages) == ["django_redislock.E025"]
    assert "same KEY_PREFIX and VERSION" in str(messages[0].hint)


def test_a_version_written_as_text_is_the_same_namespace_e025() -> None:
    """Django formats VERSION into every key: "2" and 2 are one namespace."""
    caches_ = {f"v{i}": {**redis_cache(f"redis://10.0.0.{i}:6379/0"), "VERSION": version}
               for i, version in ((1, 2), (2, "2"), (3, 2))}  # fmt: skip
    assert check({"REDLOCK": list(caches_)}, **caches_) == []
    plain = {f"d{i}": {**redis_cache(f"redis://10.0.1.{i}:6379/0"), "VERSION": version}
             for i, version in ((1, 1), (2, "1"), (3, None))}  # fmt: skip
    assert check({"REDLOCK": list(plain)}, **plain) == []


@pytest.mark.parametrize("setting", [{"CACHE": "bad"}, {"REDLOCK": ["r1", "bad", "r2"]}])
def test_a_cache_entry_that_is_not_a_dict_is_an_error_e004(setting: dict[str, Any]) -> None:
    messages = check(setting, bad="redis://127.0.0.1:1/0")
    assert ids(messages) == ["django_redislock.E004"]
    assert "'bad'" in messages[0].msg and "not a dict" in messages[0].msg
    assert "'BACKEND'" in str(messages[0].hint)


def test_a_default_lease_too_short_for_redlock_is_an_error_e024() -> None:
    messages = check({"REDLOCK": ["r1", "r2", "r3"], "TIMEOUT": 0.005})
    assert ids(messages) == ["django_redislock.E024"]
    assert "0.005" in messages[0].msg and "0.01" in messages[0].msg
    assert check({"REDLOCK": ["r1", "r2", "r3"], "TIMEOUT": 0.01}) == []
    assert check({"TIMEOUT": 0.005}) == []  # a Lock's lease may be that short


def test_several_problems_are_all_reported() -> None:
    messages = check({"TIMEOUT": 0, "AUTO_RENEW": None, "CACHE": "locmem"})
    assert sorted(ids(messages)) == [
        "django_redislock.E004",
        "django_redislock.E006",
        "django_redislock.E008",
    ]


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.redis.RedisCache",
        "django_redis.cache.RedisCache",
        f"{__name__}.SubclassedRedisCache",
        "django_valkey.cache.ValkeyCache",
        "django_valkey.cluster_cache.cache.ClusterValkeyCache",
    ],
)
def test_redis_backends_are_accepted(backend: str) -> None:
    redis_caches = {"default": {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:1/0"}}
    with override_settings(REDISLOCK={}, CACHES=redis_caches):
        assert ids(check_settings()) == ["django_redislock.W002"]  # a Redis cache: no E004


def test_check_is_registered_with_django() -> None:
    with override_settings(REDISLOCK={"CACHE": "locmem"}, CACHES=caches()):
        found = [m for m in run_checks(tags=["caches"]) if m.id.startswith("django_redislock")]
    assert ids(found) == ["django_redislock.E004"]


# fail fast: what passes the old checks but fails at the first lock -----------------------


def test_a_lock_cache_without_socket_timeouts_warns_w002() -> None:
    bare = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    messages = check({"CACHE": "bare"}, bare=bare)
    assert ids(messages) == ["django_redislock.W002"]
    assert "SOCKET_TIMEOUT" in messages[0].msg and "'SOCKET_TIMEOUT': 5" in str(messages[0].hint)
    # what an unset timeout means with the installed redis-py: tests/test_w002_defaults.py
    half = {**bare, "OPTIONS": {"SOCKET_TIMEOUT": 5}}
    assert "SOCKET_CONNECT_TIMEOUT" in check({"CACHE": "half"}, half=half)[0].msg
    builtin = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://x"}
    messages = check({"CACHE": "builtin"}, builtin=builtin)
    assert ids(messages) == ["django_redislock.W002"]
    assert "'socket_timeout': 5" in str(messages[0].hint)
    assert "no socket_connect_timeout and no socket_timeout" in messages[0].msg  # its spelling
    with_them = {**builtin, "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5}}
    assert check({"CACHE": "ok"}, ok=with_them) == []


def test_django_redis_spelling_on_the_builtin_backend_is_an_error_e027() -> None:
    """The quickstart's django-redis OPTIONS copied into Django's RedisCache gave
    only W002 ("sets no socket_timeout"), then a TypeError at the first lock."""
    builtin = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5, "CLIENT_CLASS": "x"},
    }
    messages = check({"CACHE": "builtin"}, builtin=builtin)
    assert ids(messages) == ["django_redislock.E027"]  # and not W002's misreading
    assert "'SOCKET_CONNECT_TIMEOUT', 'SOCKET_TIMEOUT', 'CLIENT_CLASS'" in messages[0].msg
    hint = str(messages[0].hint)
    assert "'SOCKET_TIMEOUT' -> 'socket_timeout'" in hint
    assert "'SOCKET_CONNECT_TIMEOUT' -> 'socket_connect_timeout'" in hint
    assert "Remove 'CLIENT_CLASS'" in hint
    # the same keys are django-redis's own on its backend: no E027
    django_redis = {**builtin, "BACKEND": "django_redis.cache.RedisCache"}
    django_redis["OPTIONS"] = {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5}
    assert check({"CACHE": "dr"}, dr=django_redis) == []
    # a REDLOCK alias is checked too
    redlock = {"CACHE": "default", "REDLOCK": ["r1", "r2", "builtin"]}
    assert "django_redislock.E027" in ids(check(redlock, builtin=builtin))


def test_the_e003_hint_names_both_backends() -> None:
    [message] = check({"CACHE": "nope"})
    assert message.id == "django_redislock.E003"
    hint = str(message.hint)
    assert "django.core.cache.backends.redis.RedisCache" in hint and "django-redis" in hint
    assert "Add a django-redis cache" not in hint


def test_a_shard_client_cache_is_an_error_e022() -> None:
    shard = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"],
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient", "SOCKET_TIMEOUT": 5},
    }
    messages = check({"CACHE": "shard"}, shard=shard)
    assert ids(messages) == ["django_redislock.E022"]
    assert messages[0].hint


def test_django_valkey_s_shard_client_is_an_error_e022() -> None:
    shard = {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"],
        "OPTIONS": {"CLIENT_CLASS": "django_valkey.client.ShardClient", "SOCKET_TIMEOUT": 5},
    }
    messages = check({"CACHE": "shard"}, shard=shard)
    assert ids(messages) == ["django_redislock.E022"]
    assert "django_valkey.client.ShardClient" in messages[0].msg


@pytest.mark.parametrize("client", ["HerdClient", "SentinelClient", "DefaultClient"])
def test_django_valkey_s_single_connection_clients_are_accepted(client: str) -> None:
    config = {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {
            "CLIENT_CLASS": f"django_valkey.client.{client}",
            "SOCKET_TIMEOUT": 5,
            "SOCKET_CONNECT_TIMEOUT": 5,
            "SENTINELS": [("127.0.0.1", 26379)],  # the SentinelClient's (E021)
        },
    }
    assert check({"CACHE": "valkey"}, valkey=config) == []


def test_django_valkey_s_sentinel_client_without_sentinels_is_an_error_e021() -> None:
    config = {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": "valkey://mymaster/0",
        "OPTIONS": {"CLIENT_CLASS": "django_valkey.client.SentinelClient", "SOCKET_TIMEOUT": 5},
    }
    messages = check({"CACHE": "sentinel"}, sentinel=config)
    assert ids(messages) == ["django_redislock.E021"]
    assert "SENTINELS" in messages[0].msg


def test_django_valkey_s_asyncio_only_cache_is_an_error_e028() -> None:
    config = {
        "BACKEND": "django_valkey.async_cache.cache.AsyncValkeyCache",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
    messages = check({"CACHE": "aio"}, aio=config)
    assert ids(messages) == ["django_redislock.E028"]
    assert "ValkeyCache" in str(messages[0].hint)


def test_sqlite_with_atomic_requests_and_inventory_warns_w003(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.conf import settings

    from django_redislock.checks import check_inventory_database

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}
    monkeypatch.setattr(settings, "DATABASES", {"default": {**sqlite, "ATOMIC_REQUESTS": True}})
    (message,) = check_inventory_database()  # tests.models.Item uses InventoryMixin
    assert message.id == "django_redislock.W003" and "transaction_mode" in str(message.hint)
    immediate = {**sqlite, "ATOMIC_REQUESTS": True, "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
    monkeypatch.setattr(settings, "DATABASES", {"default": immediate})
    assert check_inventory_database() == []
    monkeypatch.setattr(settings, "DATABASES", {"default": sqlite})
    assert check_inventory_database() == []


@pytest.mark.parametrize(
    "config",
    [
        {"LOCATION": "redis://127.0.0.1:1/0?socket_timeout=5&socket_connect_timeout=5"},
        {
            "LOCATION": ["redis://127.0.0.1:7000"],
            "OPTIONS": {
                "CLIENT_CLASS": "django_redislock.cluster.ClusterClient",
                "CLUSTER_KWARGS": {"socket_timeout": 5, "socket_connect_timeout": 5},
            },
        },
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0?socket_timeout=5&socket_connect_timeout=5",
        },
    ],
    ids=["url-query", "cluster-kwargs", "django-url-query"],
)
def test_w002_sees_socket_timeouts_set_in_the_url_or_the_cluster_kwargs(
    config: dict[str, Any],
) -> None:
    """Found by a review: it warned although the connections had timeouts."""
    cache = {"BACKEND": "django_redis.cache.RedisCache", **config}
    with override_settings(REDISLOCK={}, CACHES={"default": cache}):
        assert [m.id for m in check_settings()] == []


@pytest.mark.parametrize(
    "config",
    [
        redis_cache("redis://127.0.0.1:1/0", CONNECTION_POOL_KWARGS={"max_connections": 4}),
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5, "max_connections": 4},
        },
        redis_cache("redis://127.0.0.1:1/0?max_connections=4"),
    ],
    ids=["django-redis", "builtin", "url"],
)
def test_a_pool_too_small_for_the_locks_warns_w005(config: dict[str, Any]) -> None:
    messages = check({"CACHE": "tiny"}, tiny=config)
    assert ids(messages) == ["django_redislock.W005"]
    assert "caps its connection pool at 4" in messages[0].msg
    assert "Pool sizing" in str(messages[0].hint)
    roomy = {**config, "LOCATION": str(config["LOCATION"]).replace("=4", "=8")}
    options = dict(config.get("OPTIONS") or {})
    if "max_connections" in options:
        options["max_connections"] = 100
    if "CONNECTION_POOL_KWARGS" in options:
        options["CONNECTION_POOL_KWARGS"] = {"max_connections": 100}
    assert check({"CACHE": "roomy"}, roomy={**roomy, "OPTIONS": options}) == []
