"""System checks for ``REDISLOCK``; every id is listed in ``docs/checks.md``.

Checks never connect to Redis: they look at settings and at the configured
cache backends only, so ``manage.py check`` works on a build machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from django_redislock.conf import DEFAULTS, validate

REDIS_BACKENDS = (
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
)
CLUSTER_CLIENT = "django_redislock.cluster.ClusterClient"
SENTINEL_CLIENT = "django_redis.client.SentinelClient"
SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"
SHARD_CLIENT = "django_redis.client.ShardClient"
#: Socket timeouts to suggest, in seconds.
SUGGESTED_TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5}


def _check_id(suffix: str) -> str:
    return f"django_redislock.{suffix}"


def _cache_problem(alias: str, setting: str) -> CheckMessage | None:
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return Error(
            f"{setting} names cache alias {alias!r}, which is not in CACHES.",
            hint=f"Add a django-redis cache {alias!r} to CACHES, or name another alias.",
            id=_check_id("E003" if setting == "REDISLOCK['CACHE']" else "E011"),
        )
    if not isinstance(caches[alias], Mapping):
        return Error(
            f"{setting} names cache {alias!r}, whose CACHES entry is "
            f"{type(caches[alias]).__name__} {caches[alias]!r}, not a dict of cache settings.",
            hint=f"Write CACHES[{alias!r}] as a dict: {{'BACKEND': "
            f"'django_redis.cache.RedisCache', 'LOCATION': 'redis://...'}}.",
            id=_check_id("E004"),
        )
    backend = caches[alias].get("BACKEND", "")
    if not _is_redis_backend(backend):
        return Error(
            f"{setting} names cache {alias!r}, whose BACKEND {backend!r} is not Redis.",
            hint="Use django_redis.cache.RedisCache or Django's "
            "django.core.cache.backends.redis.RedisCache (or a subclass) for this cache.",
            id=_check_id("E004"),
        )
    return (
        _shard_problem(alias, caches[alias])
        or _cluster_problem(alias, caches[alias])
        or _sentinel_problem(alias, caches[alias])
    )


def _shard_problem(alias: str, config: Any) -> CheckMessage | None:
    """django-redis's ShardClient spreads keys over several servers and hands
    out no single connection: a lock's keys and scripts need one."""
    client = (config.get("OPTIONS") or {}).get("CLIENT_CLASS")
    if client != SHARD_CLIENT and not _is_subclass_path(client, SHARD_CLIENT):
        return None
    return Error(
        f"Cache {alias!r} uses {SHARD_CLIENT}, which cannot hand out the single Redis "
        f"connection a lock needs.",
        hint="Give the locks their own cache with django-redis's DefaultClient "
        "(REDISLOCK['CACHE']), or use REDISLOCK['REDLOCK'] over independent servers.",
        id=_check_id("E022"),
    )


def _url_options(location: object) -> dict[str, str]:
    """The query of a cache's (first) LOCATION URL, as redis-py's ``from_url`` reads it."""
    from django_redislock.primitives.redlock.servers import first_url

    first = first_url(location)
    if first is None:
        return {}
    return {key: values[-1] for key, values in parse_qs(urlsplit(first).query).items()}


def _timeouts_problem(alias: str, config: Any) -> CheckMessage | None:
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
            id=_check_id("W002"),
        )
    return Warning(
        f"{unset}: a hung Redis would block requests, releases and its renewals until the "
        f"operating system gives up on the connection (redis-py {version} has no default "
        "timeout).",
        hint=f"Add to its OPTIONS: {{{suggestion}}} (seconds).",
        id=_check_id("W002"),
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


def _sqlite_problem() -> CheckMessage | None:
    """SQLite with ATOMIC_REQUESTS and concurrent deductions: "database is locked"."""
    from django.apps import apps

    from django_redislock.models import InventoryMixin

    if not any(issubclass(m, InventoryMixin) for m in apps.get_models()):
        return None
    for alias, config in getattr(settings, "DATABASES", {}).items():
        sqlite = str(config.get("ENGINE", "")).endswith("sqlite3")
        immediate = (config.get("OPTIONS") or {}).get("transaction_mode") == "IMMEDIATE"
        if sqlite and config.get("ATOMIC_REQUESTS") and not immediate:
            return Warning(
                f"Database {alias!r} is SQLite with ATOMIC_REQUESTS, and a model uses "
                f"InventoryMixin: concurrent deductions fail with 'database is locked'.",
                hint="Use PostgreSQL in production, or set "
                "OPTIONS['transaction_mode'] = 'IMMEDIATE' (Django 5.1+) for SQLite.",
                id=_check_id("W003"),
            )
    return None


#: The middleware that answers a lock failure escaping a view (``middleware.py``).
LOCK_ERROR_MIDDLEWARE = "django_redislock.middleware.LockErrorMiddleware"


def middleware_problem(
    databases: Mapping[str, Any], middleware: Sequence[str]
) -> CheckMessage | None:
    """``ATOMIC_REQUESTS`` without ``LockErrorMiddleware``: a lock lost between a
    ``@require_lock`` view's return and its transaction's commit is a 500."""
    atomic = [alias for alias, config in databases.items() if config.get("ATOMIC_REQUESTS")]
    if not atomic or LOCK_ERROR_MIDDLEWARE in middleware:
        return None
    return Warning(
        f"ATOMIC_REQUESTS is set for {', '.join(map(repr, atomic))}: a lock of a "
        f"@require_lock view lost after the view returned and before its transaction "
        f"commits makes the commit raise LockLostError outside the decorator, and "
        f"Django answers it with a 500.",
        hint=f"Add {LOCK_ERROR_MIDDLEWARE!r} to MIDDLEWARE: it answers that error 409 "
        f"(and a lock outage 503), as the decorator does inside the view.",
        id=_check_id("W004"),
    )


@register(Tags.compatibility)
def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = middleware_problem(
        getattr(settings, "DATABASES", {}), getattr(settings, "MIDDLEWARE", ())
    )
    return [] if problem is None else [problem]


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
            f"Cache {alias!r} uses {CLUSTER_CLIENT}: {exc}", hint=hint, id=_check_id("E020")
        )
    try:
        cluster_kwargs(config.get("LOCATION") or [""], options)
    except ImproperlyConfigured as exc:
        hint = "OPTIONS['CLUSTER_KWARGS'] must be a dict of redis.cluster.RedisCluster arguments."
        return Error(
            f"Cache {alias!r} uses {CLUSTER_CLIENT}: {exc}", hint=hint, id=_check_id("E020")
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


@register(Tags.models)
def check_inventory_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = _sqlite_problem()
    return [] if problem is None else [problem]


@register(Tags.caches, Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "REDISLOCK", None)
    if raw is None:  # the defaults, as conf.py reads it
        raw = {}
    messages: list[CheckMessage] = [
        Error(p.msg, hint=p.hint or None, id=_check_id(p.id)) for p in validate(raw)
    ]
    if messages and any(m.id == _check_id("E001") for m in messages):
        return messages
    merged = {**DEFAULTS, **raw}
    if isinstance(merged["CACHE"], str) and merged["CACHE"]:
        problem = _cache_problem(merged["CACHE"], "REDISLOCK['CACHE']")
        if problem is not None:
            messages.append(problem)
        elif merged["CACHE"] in getattr(settings, "CACHES", {}):
            problem = _timeouts_problem(merged["CACHE"], settings.CACHES[merged["CACHE"]])
            if problem is not None:
                messages.append(problem)
    redlock = merged["REDLOCK"]
    if isinstance(redlock, list | tuple) and all(isinstance(a, str) and a for a in redlock):
        for alias in redlock:
            problem = _cache_problem(alias, "REDISLOCK['REDLOCK']")
            if problem is not None:
                messages.append(problem)
        problem = _shared_server_problem(redlock) if len(set(redlock)) == len(redlock) else None
        if problem is not None:  # (a repeated alias is E010's)
            messages.append(problem)
        problem = _namespace_problem(redlock, merged["KEY_PREFIX"])
        if problem is not None:
            messages.append(problem)
        problem = _redlock_lease_problem(merged["TIMEOUT"]) if redlock else None
        if problem is not None:
            messages.append(problem)
        if len(redlock) >= 3 and len(redlock) % 2 == 0:
            messages.append(
                Warning(
                    f"REDISLOCK['REDLOCK'] lists {len(redlock)} aliases; an even number "
                    f"tolerates no more failures than one fewer.",
                    hint="Use an odd number of independent Redis servers (3 or 5).",
                    id=_check_id("W001"),
                )
            )
    return messages


def _redlock_lease_problem(timeout: Any) -> CheckMessage | None:
    """A default lease a ``Lock`` can use (E006 allows 1 ms) but a ``Redlock``
    cannot: its drift allowance leaves it nothing. Caught here, not at the
    first acquire of a ``Redlock`` without a timeout of its own."""
    from django_redislock.primitives.redlock.quorum import MIN_LEASE

    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return None  # E006's
    if not 0.001 <= timeout < MIN_LEASE:
        return None
    return Error(
        f"REDISLOCK['TIMEOUT'] is {timeout!r} s, under the {MIN_LEASE} s a Redlock's lease "
        f"needs, and REDISLOCK['REDLOCK'] is set: every Redlock without a timeout of its own "
        f"would fail.",
        hint="Leases of seconds are the norm; the default is 30.",
        id=_check_id("E024"),
    )


def _namespace_problem(aliases: Any, key_prefix: Any) -> CheckMessage | None:
    """REDLOCK aliases whose caches put keys in different namespaces."""
    from django_redislock.backend.client import cache_suffix
    from django_redislock.primitives.redlock.servers import namespace_clash

    caches = getattr(settings, "CACHES", {})
    configs = [(a, caches.get(a)) for a in aliases]
    spaces = {
        alias: f"{key_prefix}{cache_suffix(config.get('KEY_PREFIX', ''), config.get('VERSION', 1))}"
        for alias, config in configs
        if isinstance(config, Mapping)
    }
    clash = namespace_clash(spaces) if spaces else None
    if clash is None:
        return None
    return Error(
        clash,
        hint="Give every cache in REDISLOCK['REDLOCK'] the same KEY_PREFIX and VERSION "
        "(or neither).",
        id=_check_id("E025"),
    )


def _shared_server_problem(aliases: Any) -> CheckMessage | None:
    """Two REDLOCK aliases on one server: a majority that one failure can take."""
    from django_redislock.primitives.redlock.servers import shared_server

    shared = shared_server(aliases, getattr(settings, "CACHES", {}))
    if shared is None:
        return None
    return Error(
        shared,
        hint="Point each alias in REDISLOCK['REDLOCK'] at a separate redis-server "
        "(another host, port or socket), ideally on separate machines.",
        id=_check_id("E023"),
    )


def _sentinel_problem(alias: str, config: Any) -> CheckMessage | None:
    """django-redis's SentinelClient needs the Sentinel factory and SENTINELS.

    Without them it fails at the first lock, in production, with an error
    that does not name the missing setting.
    """
    options = config.get("OPTIONS") or {}
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
        id=_check_id("E021"),
    )


def _is_subclass_path(path: object, base: str) -> bool:
    if not isinstance(path, str) or not path:
        return False
    from django.utils.module_loading import import_string

    try:
        return issubclass(import_string(path), import_string(base))
    except (ImportError, TypeError):
        return False
