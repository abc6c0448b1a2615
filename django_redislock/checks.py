"""System checks for ``REDISLOCK``; every id is listed in ``docs/checks.md``.

Checks never connect to Redis: they look at settings and at the configured
cache backends only, so ``manage.py check`` works on a build machine.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import DEFAULTS, validate

REDIS_BACKENDS = (
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
)
CLUSTER_CLIENT = "django_redislock.cluster.ClusterClient"
SENTINEL_CLIENT = "django_redis.client.SentinelClient"
SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"


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
    backend = caches[alias].get("BACKEND", "")
    if not _is_redis_backend(backend):
        return Error(
            f"{setting} names cache {alias!r}, whose BACKEND {backend!r} is not Redis.",
            hint="Use django_redis.cache.RedisCache (or a subclass) for this cache.",
            id=_check_id("E004"),
        )
    return _cluster_problem(alias, caches[alias]) or _sentinel_problem(alias, caches[alias])


def _cluster_problem(alias: str, config: Any) -> CheckMessage | None:
    """A cache using ``ClusterClient`` must list usable cluster startup nodes."""
    options = config.get("OPTIONS") or {}
    if options.get("CLIENT_CLASS") != CLUSTER_CLIENT:
        return None
    from django.core.exceptions import ImproperlyConfigured

    from .cluster import cluster_kwargs, parse_startup_nodes

    try:
        parse_startup_nodes(config.get("LOCATION") or [])
        cluster_kwargs(config.get("LOCATION") or [""], options)
    except ImproperlyConfigured as exc:
        return Error(
            f"Cache {alias!r} uses {CLUSTER_CLIENT}: {exc}",
            hint='LOCATION must list cluster nodes, e.g. ["redis://10.0.0.1:7000"].',
            id=_check_id("E020"),
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


@register(Tags.caches, Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "REDISLOCK", {})
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
    redlock = merged["REDLOCK"]
    if isinstance(redlock, list | tuple) and all(isinstance(a, str) and a for a in redlock):
        for alias in redlock:
            problem = _cache_problem(alias, "REDISLOCK['REDLOCK']")
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
