"""Helpers for testing a project that uses django-redislock.

- ``fakeredis_caches()``: ``CACHES`` for an in-process fakeredis server, for
  fast unit tests that need no Redis server (concurrency claims still need a
  real one: fakeredis runs in one process).
- ``release_transaction_holds()``: release what ``@require_lock`` and
  ``InventoryMixin`` handed to a test transaction that never commits, as the
  commit would (``TestCase``, pytest-django's ``django_db``).
- ``assert_no_locks_held()``: fail, naming them, if any lock, semaphore or
  read-write lock is still held (a leak between tests).

fakeredis is imported only when ``fakeredis_caches`` is called.
"""

from __future__ import annotations

from typing import Any

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.ops import inspection
from django_redislock.transactions import release_transaction_holds

__all__ = ["assert_no_locks_held", "fakeredis_caches", "release_transaction_holds"]


def fakeredis_caches(alias: str = "default") -> dict[str, Any]:
    """``CACHES`` with ``alias`` on a new in-process fakeredis server (needs
    ``pip install 'fakeredis[lua]'``): every connection of the process shares
    that server, so locks exclude each other across threads."""
    import fakeredis

    server = fakeredis.FakeServer()
    # FakeRedisConnection in fakeredis >= 2.30, FakeConnection before
    connection_class = getattr(fakeredis, "FakeRedisConnection", None) or fakeredis.FakeConnection
    return {
        alias: {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://fakeredis-{id(server)}/0",
            "OPTIONS": {
                "SOCKET_CONNECT_TIMEOUT": 5,
                "SOCKET_TIMEOUT": 5,
                "CONNECTION_POOL_KWARGS": {
                    "connection_class": connection_class,
                    "server": server,
                },
            },
        }
    }


def assert_no_locks_held(using: str | None = None) -> None:
    """Raise ``AssertionError`` listing every name still held through the cache
    ``using`` (default ``REDISLOCK["CACHE"]``); found with SCAN, never KEYS."""
    settings = get_settings()
    alias = using or settings.cache
    held = inspection.list_held(
        backend.get_client(alias), backend.namespace(alias, settings.key_prefix)
    )
    if held:
        listed = ", ".join(
            f"{info.kind} {info.name!r} ({', '.join(h.holder for h in info.holders)})"
            for info in held
        )
        raise AssertionError(f"{len(held)} still held: {listed}")
