"""The checks of ``REDISLOCK['REDLOCK']``: independent servers, apart
namespaces and a lease a ``Redlock`` can use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error

from django_redislock.checks.caches import check_id


def redlock_lease_problem(timeout: Any) -> CheckMessage | None:
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
        id=check_id("E024"),
    )


def namespace_problem(aliases: Any, key_prefix: Any) -> CheckMessage | None:
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
        id=check_id("E025"),
    )


def shared_server_problem(aliases: Any) -> CheckMessage | None:
    """Two REDLOCK aliases on one server: a majority that one failure can take."""
    from django_redislock.primitives.redlock.servers import shared_server

    shared = shared_server(aliases, getattr(settings, "CACHES", {}))
    if shared is None:
        return None
    return Error(
        shared,
        hint="Point each alias in REDISLOCK['REDLOCK'] at a separate redis-server "
        "(another host, port or socket), ideally on separate machines.",
        id=check_id("E023"),
    )
