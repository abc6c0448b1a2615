"""The checks of one cache's configuration: a Redis backend, the client
class, the socket timeouts, the pool's size, Sentinel, Cluster and shards.

Read only from ``settings.CACHES``: nothing connects to Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

REDIS_BACKENDS = (
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
    "django_valkey.cache.ValkeyCache",
    "django_valkey.cluster_cache.cache.ClusterValkeyCache",
)


#: django-valkey's asyncio-only cache: its client's every method is a coroutine.
ASYNC_VALKEY_BACKEND = "django_valkey.async_cache.cache.AsyncValkeyCache"


CLUSTER_CLIENT = "django_redislock.cluster.ClusterClient"


SENTINEL_CLIENT = "django_redis.client.SentinelClient"


SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"


VALKEY_SENTINEL_CLIENT = "django_valkey.client.SentinelClient"


SHARD_CLIENT = "django_redis.client.ShardClient"


VALKEY_SHARD_CLIENT = "django_valkey.client.ShardClient"


#: Socket timeouts to suggest, in seconds.
SUGGESTED_TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5}


def check_id(suffix: str) -> str:
    return f"django_redislock.{suffix}"


def cache_problem(alias: str, setting: str) -> CheckMessage | None:
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return Error(
            f"{setting} names cache alias {alias!r}, which is not in CACHES.",
            hint=f"Add a Redis cache {alias!r} to CACHES (django-redis's or Django's "
            "django.core.cache.backends.redis.RedisCache), or name another alias.",
            id=check_id("E003" if setting == "REDISLOCK['CACHE']" else "E011"),
        )
    if not isinstance(caches[alias], Mapping):
        return Error(
            f"{setting} names cache {alias!r}, whose CACHES entry is "
            f"{type(caches[alias]).__name__} {caches[alias]!r}, not a dict of cache settings.",
            hint=f"Write CACHES[{alias!r}] as a dict: {{'BACKEND': "
            f"'django_redis.cache.RedisCache', 'LOCATION': 'redis://...'}}.",
            id=check_id("E004"),
        )
    backend = caches[alias].get("BACKEND", "")
    if backend == ASYNC_VALKEY_BACKEND or _is_subclass_path(backend, ASYNC_VALKEY_BACKEND):
        return Error(
            f"{setting} names cache {alias!r}, whose BACKEND {backend!r} is django-valkey's "
            f"asyncio-only cache: its client cannot serve a Lock, whose calls are synchronous.",
            hint="Give the locks a django_valkey.cache.ValkeyCache alias on the same server; "
            "AsyncLock runs on an asyncio client of its own built from it.",
            id=check_id("E028"),
        )
    if not _is_redis_backend(backend):
        return Error(
            f"{setting} names cache {alias!r}, whose BACKEND {backend!r} is not Redis.",
            hint="Use django_redis.cache.RedisCache, Django's "
            "django.core.cache.backends.redis.RedisCache or django_valkey.cache.ValkeyCache "
            "(or a subclass) for this cache.",
            id=check_id("E004"),
        )
    return (
        _shard_problem(alias, caches[alias])
        or _cluster_problem(alias, caches[alias])
        or _sentinel_problem(alias, caches[alias])
        or _builtin_options_problem(alias, caches[alias])
    )


#: django-redis's OPTIONS and what Django's RedisCache calls them (redis-py's keywords).
BUILTIN_SPELLING = {
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
    "SOCKET_TIMEOUT": "socket_timeout",
    "PASSWORD": "password",
    "CONNECTION_POOL_CLASS": "pool_class",
    "PARSER_CLASS": "parser_class",
}


def _builtin_options_problem(alias: str, config: Any) -> CheckMessage | None:
    """Django's RedisCache hands its OPTIONS to redis-py as keywords: a key in
    django-redis's upper case is a ``TypeError`` at the first connection (and
    a timeout spelled so is not set, which W002 would misreport)."""
    options = config.get("OPTIONS") or {}
    upper = [k for k in options if isinstance(k, str) and k != k.lower()]
    if config.get("BACKEND") != "django.core.cache.backends.redis.RedisCache" or not upper:
        return None
    fix = [f"{k!r} -> {BUILTIN_SPELLING[k]!r}" for k in upper if k in BUILTIN_SPELLING]
    drop = [repr(k) for k in upper if k not in BUILTIN_SPELLING]
    return Error(
        f"Cache {alias!r} uses django.core.cache.backends.redis.RedisCache, whose OPTIONS "
        f"are redis-py's lower-case keywords, and sets {', '.join(map(repr, upper))} "
        "(django-redis's spelling): the first lock would fail with a TypeError.",
        hint=" ".join(
            (["Write " + ", ".join(fix) + "."] if fix else [])
            + ([f"Remove {', '.join(drop)}: django-redis options."] if drop else [])
        ),
        id=check_id("E027"),
    )


def _shard_problem(alias: str, config: Any) -> CheckMessage | None:
    """django-redis's ShardClient spreads keys over several servers and hands
    out no single connection: a lock's keys and scripts need one."""
    client = (config.get("OPTIONS") or {}).get("CLIENT_CLASS")
    shard = next(
        (
            s
            for s in (SHARD_CLIENT, VALKEY_SHARD_CLIENT)
            if client == s or _is_subclass_path(client, s)
        ),
        None,
    )
    if shard is None:
        return None
    return Error(
        f"Cache {alias!r} uses {shard}, which cannot hand out the single Redis "
        f"connection a lock needs.",
        hint="Give the locks their own cache with the DefaultClient "
        "(REDISLOCK['CACHE']), or use REDISLOCK['REDLOCK'] over independent servers.",
        id=check_id("E022"),
    )


def _url_options(location: object) -> dict[str, str]:
    """The query of a cache's (first) LOCATION URL, as redis-py's ``from_url`` reads it."""
    from django_redislock.primitives.redlock.servers import first_url

    first = first_url(location)
    if first is None:
        return {}
    return {key: values[-1] for key, values in parse_qs(urlsplit(first).query).items()}


def timeouts_problem(alias: str, config: Any) -> CheckMessage | None:
    """Without socket timeouts a hung Redis blocks a request until the OS gives
    up (minutes), and a lost lease is reported late."""
    options = config.get("OPTIONS") or {}
    # django-redis's pool kwargs, Redis Cluster's, and the LOCATION URL's query
    # (redis-py's from_url applies ?socket_timeout=5 to the connections)
    pool = {
        **_url_options(config.get("LOCATION")),
        **(options.get("CLUSTER_KWARGS") or {}),
        **(options.get("CONNECTION_POOL_KWARGS") or {}),
    }
    if config.get("BACKEND") == "django.core.cache.backends.redis.RedisCache":
        names = {
            "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
            "SOCKET_TIMEOUT": "socket_timeout",
        }
        # named as this backend spells them in OPTIONS
        missing = [v for v in names.values() if options.get(v) is None and pool.get(v) is None]
        suggestion = ", ".join(f"{names[k]!r}: {v}" for k, v in SUGGESTED_TIMEOUTS.items())
    else:
        missing = [
            k for k in SUGGESTED_TIMEOUTS
            if options.get(k) is None and pool.get(k.lower()) is None
        ]  # fmt: skip
        suggestion = ", ".join(f"{k!r}: {v}" for k, v in SUGGESTED_TIMEOUTS.items())
    if not missing:
        return None
    version, connect, command = redis_py_defaults()
    unset = f"Cache {alias!r}, which the locks use, sets no {' and no '.join(missing)}"
    if connect and command:
        return Warning(
            f"{unset}: it relies on redis-py {version}'s defaults ({connect:g} s to connect, "
            f"{command:g} s per command); redis-py before 8 has none, and there a hung Redis "
            "would block requests, releases and its renewals until the operating system "
            "gives up on the connection.",
            hint=f"Set them in its OPTIONS to keep a bound whatever the redis-py version: "
            f"{{{suggestion}}} (seconds).",
            id=check_id("W002"),
        )
    return Warning(
        f"{unset}: a hung Redis would block requests, releases and its renewals until the "
        f"operating system gives up on the connection (redis-py {version} has no default "
        "timeout).",
        hint=f"Add to its OPTIONS: {{{suggestion}}} (seconds).",
        id=check_id("W002"),
    )


#: The smallest pool cap the locks work well with: the shared wake-up
#: connection, the background writers' three (docs/operations.md, "Pool
#: sizing"), and a few commands at once.
MIN_POOL = 8


def pool_problem(alias: str, config: Any) -> CheckMessage | None:
    """A pool capped below what the locks need of it makes every acquire wait
    for a connection (then time out) however idle Redis is."""
    options = config.get("OPTIONS") or {}
    size = (
        (options.get("CONNECTION_POOL_KWARGS") or {}).get("max_connections")
        or options.get("max_connections")
        or _url_options(config.get("LOCATION")).get("max_connections")
    )
    try:
        size = int(size) if size is not None else None
    except (TypeError, ValueError):
        return None
    if size is None or size >= MIN_POOL:
        return None
    return Warning(
        f"Cache {alias!r}, which the locks use, caps its connection pool at {size}: the "
        f"locks need one for the shared wake-up connection of their waiters, up to 3 for "
        f"renewals and counters, and one per thread that sends a command at once, so "
        f"acquires would wait for a connection (then time out) while Redis idles.",
        hint=f"Raise max_connections to at least {MIN_POOL}; docs/operations.md, "
        f'"Pool sizing", gives the formula.',
        id=check_id("W005"),
    )


def redis_py_defaults() -> tuple[str, float | None, float | None]:
    """The installed redis-py's version and what its connections time out
    after when given no timeouts: ``(version, connect, per command)``, each
    ``None`` for no timeout. Read from a new (unconnected) connection, not a
    table of versions: redis-py 8 gives 5 s to both, earlier versions none."""
    import redis

    connection = redis.Connection()  # type: ignore[no-untyped-call]
    return (
        redis.__version__,
        connection.socket_connect_timeout or None,
        connection.socket_timeout or None,
    )


def _cluster_problem(alias: str, config: Any) -> CheckMessage | None:
    """A cache using ``ClusterClient`` must list usable cluster startup nodes."""
    options = config.get("OPTIONS") or {}
    if options.get("CLIENT_CLASS") != CLUSTER_CLIENT:
        return None
    from django.core.exceptions import ImproperlyConfigured

    from django_redislock.cluster import cluster_kwargs, parse_startup_nodes

    try:
        parse_startup_nodes(config.get("LOCATION") or [])
    except ImproperlyConfigured as exc:
        hint = 'LOCATION must list cluster nodes, e.g. ["redis://10.0.0.1:7000"].'
        return Error(
            f"Cache {alias!r} uses {CLUSTER_CLIENT}: {exc}", hint=hint, id=check_id("E020")
        )
    try:
        cluster_kwargs(config.get("LOCATION") or [""], options)
    except ImproperlyConfigured as exc:
        hint = "OPTIONS['CLUSTER_KWARGS'] must be a dict of redis.cluster.RedisCluster arguments."
        return Error(
            f"Cache {alias!r} uses {CLUSTER_CLIENT}: {exc}", hint=hint, id=check_id("E020")
        )
    return None


def _is_redis_backend(path: str) -> bool:
    if path in REDIS_BACKENDS:
        return True
    from django.utils.module_loading import import_string

    try:
        backend = import_string(path)
    except ImportError:
        return False
    for known in REDIS_BACKENDS:
        try:
            if issubclass(backend, import_string(known)):
                return True
        except ImportError:
            continue
    return False


def _sentinel_problem(alias: str, config: Any) -> CheckMessage | None:
    """django-redis's SentinelClient needs the Sentinel factory and SENTINELS.

    Without them it fails at the first lock, in production, with an error
    that does not name the missing setting.
    """
    options = config.get("OPTIONS") or {}
    if options.get("CLIENT_CLASS") == VALKEY_SENTINEL_CLIENT:
        return _valkey_sentinel_problem(alias, options)
    if options.get("CLIENT_CLASS") != SENTINEL_CLIENT:
        return None
    factory = options.get("CONNECTION_FACTORY") or getattr(
        settings, "DJANGO_REDIS_CONNECTION_FACTORY", None
    )
    missing = []
    if factory != SENTINEL_FACTORY and not _is_subclass_path(factory, SENTINEL_FACTORY):
        missing.append(
            f"OPTIONS['CONNECTION_FACTORY'] (or DJANGO_REDIS_CONNECTION_FACTORY) "
            f"= {SENTINEL_FACTORY!r}"
        )
    sentinels = options.get("SENTINELS")
    if not isinstance(sentinels, list | tuple) or not sentinels:
        missing.append("OPTIONS['SENTINELS'] = [(host, port), ...]")
    if not missing:
        return None
    return Error(
        f"Cache {alias!r} uses {SENTINEL_CLIENT} but lacks {' and '.join(missing)}.",
        hint="See the Sentinel section of the scale-out docs.",
        id=check_id("E021"),
    )


def _valkey_sentinel_problem(alias: str, options: Any) -> CheckMessage | None:
    """django-valkey's SentinelClient brings its Sentinel factory; SENTINELS it needs."""
    sentinels = options.get("SENTINELS")
    if isinstance(sentinels, list | tuple) and sentinels:
        return None
    return Error(
        f"Cache {alias!r} uses {VALKEY_SENTINEL_CLIENT} but lacks "
        f"OPTIONS['SENTINELS'] = [(host, port), ...].",
        hint="See the Sentinel section of the scale-out docs.",
        id=check_id("E021"),
    )


def _is_subclass_path(path: object, base: str) -> bool:
    if not isinstance(path, str) or not path:
        return False
    from django.utils.module_loading import import_string

    try:
        return issubclass(import_string(path), import_string(base))
    except (ImportError, TypeError):
        return False
