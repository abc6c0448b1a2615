"""System checks for ``REDISLOCK``; every id is listed in ``docs/checks.md``.

Checks never connect to Redis: they look at settings and at the configured
cache backends only, so ``manage.py check`` works on a build machine. This
module registers them; ``caches`` checks one cache's configuration,
``redlock`` the Redlock servers'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from django_redislock.checks.caches import cache_problem, check_id, pool_problem, timeouts_problem
from django_redislock.checks.redlock import (
    namespace_problem,
    redlock_lease_problem,
    shared_server_problem,
)
from django_redislock.conf import DEFAULTS, validate


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
                id=check_id("W003"),
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
        id=check_id("W004"),
    )


@register(Tags.compatibility)
def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = middleware_problem(
        getattr(settings, "DATABASES", {}), getattr(settings, "MIDDLEWARE", ())
    )
    return [] if problem is None else [problem]


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
        Error(p.msg, hint=p.hint or None, id=check_id(p.id)) for p in validate(raw)
    ]
    if messages and any(m.id == check_id("E001") for m in messages):
        return messages
    merged = {**DEFAULTS, **raw}
    if isinstance(merged["CACHE"], str) and merged["CACHE"]:
        problem = cache_problem(merged["CACHE"], "REDISLOCK['CACHE']")
        if problem is not None:
            messages.append(problem)
        elif merged["CACHE"] in getattr(settings, "CACHES", {}):
            config = settings.CACHES[merged["CACHE"]]
            for found in (timeouts_problem, pool_problem):
                problem = found(merged["CACHE"], config)
                if problem is not None:
                    messages.append(problem)
    redlock = merged["REDLOCK"]
    if isinstance(redlock, list | tuple) and all(isinstance(a, str) and a for a in redlock):
        for alias in redlock:
            problem = cache_problem(alias, "REDISLOCK['REDLOCK']")
            if problem is not None:
                messages.append(problem)
        problem = shared_server_problem(redlock) if len(set(redlock)) == len(redlock) else None
        if problem is not None:  # (a repeated alias is E010's)
            messages.append(problem)
        problem = namespace_problem(redlock, merged["KEY_PREFIX"])
        if problem is not None:
            messages.append(problem)
        problem = redlock_lease_problem(merged["TIMEOUT"]) if redlock else None
        if problem is not None:
            messages.append(problem)
        if len(redlock) >= 3 and len(redlock) % 2 == 0:
            messages.append(
                Warning(
                    f"REDISLOCK['REDLOCK'] lists {len(redlock)} aliases; an even number "
                    f"tolerates no more failures than one fewer.",
                    hint="Use an odd number of independent Redis servers (3 or 5).",
                    id=check_id("W001"),
                )
            )
    return messages
