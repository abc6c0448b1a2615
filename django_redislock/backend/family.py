"""Which client library a connection belongs to: redis-py or valkey-py.

valkey-py is a fork of redis-py with the same API under other names: its
``valkey.Valkey`` answers every command ``redis.Redis`` does, but raises
``valkey.exceptions.ConnectionError``, not redis-py's, replies ``NOSCRIPT``
with its own ``NoScriptError``, and has its own asyncio client, pools and
connection classes. A lock on a django-valkey cache must catch, build and
retry with valkey-py's classes, and one on django-redis with redis-py's,
never a mix (a valkey-py pool cannot be given a redis-py connection class).

This module is the one place that knows the difference. ``of(client)`` is the
client's :class:`Family`; ``loaded()`` is every family a running process can
meet, for catching an error with no client at hand. valkey-py is an extra
(``django-redislock[valkey]``): its family is built, and ``valkey`` imported,
only once a valkey-py client exists (``sys.modules`` has it then), so a site on
django-redis never imports it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

#: The top-level package of each family, by the name reported in errors.
REDIS_PY = "redis"
VALKEY_PY = "valkey"


@dataclass(frozen=True)
class Family:
    """One client library's classes, as the rest of the package needs them."""

    #: ``"redis"`` or ``"valkey"``, the import name.
    name: str
    #: The client library's top-level module (``redis.Redis``, ``valkey.Valkey``).
    module: ModuleType
    #: The root of the library's errors (``RedisError``, ``ValkeyError``).
    error: type[Exception]
    connection_error: type[Exception]
    timeout_error: type[Exception]
    response_error: type[Exception]
    no_script_error: type[Exception]
    #: A pool at its cap (``None`` in redis-py 5.0, which raised a plain
    #: ``ConnectionError``).
    max_connections_error: type[Exception] | None
    #: What a cluster none of whose nodes answers raises (no ``error`` subclass).
    cluster_exception: type[Exception]
    #: The synchronous cluster client (``RedisCluster``, ``ValkeyCluster``).
    cluster_client: type[Any]
    connection_pool: type[Any]
    blocking_connection_pool: type[Any]
    #: Sync connection class -> its asyncio counterpart, for ``backend.aio``.
    async_connections: dict[type[Any], type[Any]]
    async_module: ModuleType
    #: The asyncio client (``redis.asyncio.Redis``, ``valkey.asyncio.Valkey``).
    async_client: type[Any]
    #: ``Retry`` and ``NoBackoff``, for a pool of the family's own.
    retry: type[Any]
    no_backoff: type[Any]

    def node_client(self, cluster: Any, node: Any) -> Any:
        """The plain client of one node of a cluster client (redis-py's
        ``get_redis_connection``, valkey-py's ``get_valkey_connection``)."""
        return getattr(cluster, f"get_{self.name}_connection")(node)

    @property
    def backend_errors(self) -> tuple[type[BaseException], ...]:
        """Everything the library or the socket raises when the server fails."""
        return (self.error, self.cluster_exception, OSError)

    @property
    def dropped(self) -> tuple[type[BaseException], ...]:
        """What the library raises when it dropped the connection a command was on."""
        return (self.connection_error, self.timeout_error, OSError)


def _build(name: str) -> Family:
    """A family from its modules, which are spelled alike in both libraries."""
    top = importlib.import_module(name)
    errors = importlib.import_module(f"{name}.exceptions")
    connection = importlib.import_module(f"{name}.connection")
    cluster = importlib.import_module(f"{name}.cluster")
    aio = importlib.import_module(f"{name}.asyncio")
    aio_connection = importlib.import_module(f"{name}.asyncio.connection")
    retry = importlib.import_module(f"{name}.retry")
    backoff = importlib.import_module(f"{name}.backoff")
    prefix = "Redis" if name == REDIS_PY else "Valkey"
    return Family(
        name=name,
        module=top,
        error=getattr(errors, f"{prefix}Error"),
        connection_error=errors.ConnectionError,
        timeout_error=errors.TimeoutError,
        response_error=errors.ResponseError,
        no_script_error=errors.NoScriptError,
        max_connections_error=getattr(errors, "MaxConnectionsError", None),
        cluster_exception=getattr(errors, f"{prefix}ClusterException"),
        cluster_client=getattr(cluster, f"{prefix}Cluster"),
        connection_pool=connection.ConnectionPool,
        blocking_connection_pool=connection.BlockingConnectionPool,
        async_connections={
            connection.Connection: aio_connection.Connection,
            connection.SSLConnection: aio_connection.SSLConnection,
            connection.UnixDomainSocketConnection: aio_connection.UnixDomainSocketConnection,
        },
        async_module=aio,
        async_client=getattr(aio, prefix),
        retry=retry.Retry,
        no_backoff=backoff.NoBackoff,
    )


@functools.cache
def family_named(name: str) -> Family:
    """The family of the library imported as ``name`` (``"redis"`` or ``"valkey"``)."""
    if name not in (REDIS_PY, VALKEY_PY):
        raise ValueError(f"no client family {name!r}; expected 'redis' or 'valkey'")
    return _build(name)


def redis_py() -> Family:
    return family_named(REDIS_PY)


def of(client: object) -> Family:
    """The family of ``client`` (a client, pipeline, pool or connection, sync or
    asyncio): valkey-py's if its class or a base of it comes from the ``valkey``
    package, redis-py's otherwise (fakeredis and other redis-py subclasses
    included). No ``valkey`` module imported: no valkey-py object exists."""
    if VALKEY_PY in sys.modules:
        for cls in type(client).__mro__:
            if cls.__module__ == VALKEY_PY or cls.__module__.startswith("valkey."):
                return family_named(VALKEY_PY)
    return redis_py()


def loaded() -> tuple[Family, ...]:
    """Every family whose library this process has imported: the ones whose
    errors can be raised here. redis-py always; valkey-py once imported."""
    if VALKEY_PY in sys.modules:
        return (redis_py(), family_named(VALKEY_PY))
    return (redis_py(),)


def backend_errors() -> tuple[type[BaseException], ...]:
    """``Family.backend_errors`` of every loaded family, for ``except``."""
    return tuple(dict.fromkeys(e for f in loaded() for e in f.backend_errors))


def dropped() -> tuple[type[BaseException], ...]:
    """``Family.dropped`` of every loaded family."""
    return tuple(dict.fromkeys(e for f in loaded() for e in f.dropped))


def timeouts() -> tuple[type[BaseException], ...]:
    """Every loaded family's ``TimeoutError`` class."""
    return tuple(f.timeout_error for f in loaded())


def response_errors() -> tuple[type[BaseException], ...]:
    """Every loaded family's ``ResponseError`` (an error reply from the server)."""
    return tuple(f.response_error for f in loaded())


def no_script_errors() -> tuple[type[BaseException], ...]:
    """Every loaded family's ``NoScriptError`` (a ``NOSCRIPT`` reply)."""
    return tuple(f.no_script_error for f in loaded())


def connection_errors() -> tuple[type[BaseException], ...]:
    """Every loaded family's ``ConnectionError``, and ``TimeoutError``: the
    server is unreachable or did not answer."""
    return tuple(e for f in loaded() for e in (f.connection_error, f.timeout_error))


def library_errors() -> tuple[type[BaseException], ...]:
    """Every loaded family's root error (``RedisError``, ``ValkeyError``)."""
    return tuple(f.error for f in loaded())


def is_cluster(client: object) -> bool:
    """Whether ``client`` is its family's cluster client."""
    return isinstance(client, of(client).cluster_client)


__all__ = [
    "Family",
    "backend_errors",
    "connection_errors",
    "dropped",
    "family_named",
    "is_cluster",
    "library_errors",
    "loaded",
    "no_script_errors",
    "of",
    "redis_py",
    "response_errors",
    "timeouts",
]
