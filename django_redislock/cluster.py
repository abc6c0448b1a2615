"""A django-redis ``CLIENT_CLASS`` for Redis Cluster.

django-redis has no cluster client; redis-py has ``redis.cluster.RedisCluster``,
which routes every command (and every ``EVALSHA``) to the node owning its
key's hash slot and follows ``MOVED``/``ASK`` redirections. ``ClusterClient``
is django-redis's ``DefaultClient`` whose connection is one such
``RedisCluster``::

    CACHES = {
        "locks": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"],
            "OPTIONS": {"CLIENT_CLASS": "django_redislock.cluster.ClusterClient"},
        },
    }

``LOCATION`` lists startup nodes (one is enough; the rest of the cluster is
discovered). ``PASSWORD``, ``USERNAME``, ``SOCKET_TIMEOUT`` and
``SOCKET_CONNECT_TIMEOUT`` are honoured, and ``CLUSTER_KWARGS`` is passed to
``RedisCluster`` as is. Every key of one primitive shares one hash slot (see
``backend.key``), so the lock scripts run on one node.

The ``RedisCluster`` is shared by every ``ClusterClient`` with the same
settings in a process (Django builds a cache client per thread; a cluster
client holds a pool per node, too costly to repeat).
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured
from django_redis.client import DefaultClient
from redis.cluster import ClusterNode, RedisCluster

#: Options of ``OPTIONS`` that become ``RedisCluster`` keyword arguments.
_OPTION_KWARGS = {
    "PASSWORD": "password",
    "USERNAME": "username",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
}

Locations = list[str] | tuple[str, ...] | str


def parse_startup_nodes(locations: Locations) -> list[tuple[str, int]]:
    """``(host, port)`` of each ``redis://host:port`` location; ``ImproperlyConfigured`` if bad.

    Cluster mode has only database 0, so another database number is refused
    rather than silently ignored.
    """
    if isinstance(locations, str):
        locations = [part for part in locations.split(",") if part.strip()]
    if not locations:
        raise ImproperlyConfigured("ClusterClient needs LOCATION: one or more redis:// URLs.")
    nodes = []
    for location in locations:
        parsed = urlparse(str(location).strip())
        if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
            raise ImproperlyConfigured(
                f"ClusterClient LOCATION entries must be redis://host:port URLs, not {location!r}."
            )
        try:
            port = parsed.port or 6379
        except ValueError as exc:
            raise ImproperlyConfigured(f"Bad port in cluster LOCATION {location!r}.") from exc
        database = parsed.path.strip("/")
        if database not in ("", "0"):
            raise ImproperlyConfigured(
                f"Redis Cluster has only database 0; LOCATION {location!r} asks for {database}."
            )
        nodes.append((parsed.hostname, port))
    return nodes


def cluster_kwargs(
    locations: list[str] | tuple[str, ...] | str, options: dict[str, Any]
) -> dict[str, Any]:
    """``RedisCluster`` keyword arguments for a cache's ``LOCATION`` and ``OPTIONS``."""
    first = urlparse(str(locations[0] if not isinstance(locations, str) else locations))
    kwargs: dict[str, Any] = {}
    if first.username:
        kwargs["username"] = unquote(first.username)
    if first.password:
        kwargs["password"] = unquote(first.password)
    if first.scheme == "rediss":
        kwargs["ssl"] = True
    for option, name in _OPTION_KWARGS.items():
        if options.get(option) is not None:
            kwargs[name] = options[option]
    extra = options.get("CLUSTER_KWARGS", {})
    if not isinstance(extra, dict):
        raise ImproperlyConfigured(f"CLUSTER_KWARGS must be a dict, not {extra!r}.")
    kwargs.update(extra)
    return kwargs


class _Clusters:
    """One ``RedisCluster`` per (startup nodes, options), per process."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Start empty: also in a forked child, where another thread of the
        parent may have held the lock at ``fork()`` (it would stay locked for
        ever) and a client's own locks and node tables are the parent's."""
        self._lock = threading.Lock()
        self._clients: dict[str, RedisCluster] = {}

    def get(self, locations: Locations, options: dict[str, Any]) -> RedisCluster:
        nodes = parse_startup_nodes(locations)
        kwargs = cluster_kwargs(locations, options)
        ident = repr((nodes, sorted(kwargs.items(), key=lambda item: item[0])))
        with self._lock:
            client = self._clients.get(ident)
            if client is None:
                node: Any = ClusterNode  # untyped in redis-py
                client = RedisCluster(
                    startup_nodes=[node(host, port) for host, port in nodes], **kwargs
                )
                self._clients[ident] = client
            return client


_clusters = _Clusters()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_clusters._reset)


class ClusterClient(DefaultClient):  # type: ignore[misc]
    """django-redis's ``DefaultClient`` on a ``redis.cluster.RedisCluster``.

    Single-key cache operations work as usual; multi-key ones (``get_many``,
    ``delete_pattern``) span slots and are best kept off this alias: give the
    locks a cache alias of their own (``REDISLOCK["CACHE"]``).
    """

    def connect(self, index: int = 0) -> RedisCluster:
        return _clusters.get(tuple(self._server), self._options)
