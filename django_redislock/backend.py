"""The one gateway to Redis: clients, key names, error translation, SCAN.

No other module imports django-redis, and only this module and ``scripts``
touch redis-py's API directly, so a change of client library or topology
(Sentinel, Cluster) is a change here.

Key layout: ``<prefix>:{<name>}:<part>``. The braces make every key of one
primitive share a Redis Cluster hash slot. Braces (and ``%``) inside a name are
percent-encoded, so a name can never end the hash tag early and the encoding is
reversible for display.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.cluster
import redis.connection
from django.core.cache import InvalidCacheBackendError, caches
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import NoScriptError, RedisError

from .exceptions import LockBackendError

if TYPE_CHECKING:
    from .scripts import Script

#: The longest a single blocking Redis command may wait when the connection has
#: no socket timeout; waits longer than this are split, which is also the
#: bound on how late a waiter notices a wake-up that was lost.
MAX_WAIT_CHUNK = 2.0
#: Share of the socket timeout a blocking command may use, leaving room for the
#: round trip so that the client never times out a healthy BLPOP.
SOCKET_TIMEOUT_SHARE = 0.5
MIN_WAIT_CHUNK = 0.01

_ENCODE = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def encode_name(name: str) -> str:
    return name.translate(_ENCODE)


def decode_name(encoded: str) -> str:
    return encoded.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


def key(prefix: str, name: str, part: str) -> str:
    return f"{prefix}:{{{encode_name(name)}}}:{part}"


def parse_key(prefix: str, raw: str | bytes) -> tuple[str, str] | None:
    """Split a key written by this app into ``(name, part)``; ``None`` for others."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    head = prefix + ":{"
    if not text.startswith(head):
        return None
    end = text.find("}:", len(head))
    if end < 0:
        return None
    return decode_name(text[len(head) : end]), text[end + 2 :]


class _ClientCache:
    """Clients per alias, remembered while Django's settings object is the same.

    Django's cache handler is thread-local and comparatively slow to consult;
    redis-py clients are thread-safe and fork-aware, so one per alias serves the
    whole process. ``override_settings`` replaces the settings object, which
    empties this cache.
    """

    def __init__(self) -> None:
        self._entry: tuple[object, dict[str, tuple[Any, float]]] = (None, {})

    def get(self, alias: str) -> tuple[Any, float]:
        from .conf import _wrapped_settings

        wrapped = _wrapped_settings()
        owner, clients = self._entry
        if owner is not wrapped:
            clients = {}
            self._entry = (wrapped, clients)
        found = clients.get(alias)
        if found is None:
            client = _client_for(alias)
            found = clients[alias] = (client, wait_chunk(client))
        return found


_clients = _ClientCache()


def get_client(alias: str) -> Any:
    """The synchronous redis-py client behind a cache alias.

    Accepts django-redis caches and Django's built-in ``RedisCache``; anything
    else is an ``ImproperlyConfigured`` naming the alias and its backend.
    """
    return _clients.get(alias)[0]


def get_client_and_chunk(alias: str) -> tuple[Any, float]:
    """The client and the longest one blocking command may wait on it."""
    return _clients.get(alias)


def _client_for(alias: str) -> Any:
    try:
        cache = caches[alias]
    except InvalidCacheBackendError as exc:
        raise ImproperlyConfigured(
            f"django-redislock: cache alias {alias!r} is not defined in CACHES."
        ) from exc
    backend = f"{type(cache).__module__}.{type(cache).__qualname__}"
    client = getattr(cache, "client", None)
    get = getattr(client, "get_client", None)
    try:
        if callable(get):  # django-redis
            return get(write=True)
        inner = getattr(cache, "_cache", None)  # django.core.cache.backends.redis
        if inner is not None and callable(getattr(inner, "get_client", None)):
            return inner.get_client(None, write=True)
    except (NotImplementedError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"django-redislock: cache {alias!r} ({backend}) cannot give a raw Redis "
            f"connection; use django-redis's DefaultClient or SentinelClient."
        ) from exc
    raise ImproperlyConfigured(
        f"django-redislock: cache {alias!r} uses {backend}, which is not Redis-backed; "
        f"use django_redis.cache.RedisCache."
    )


def wait_chunk(client: Any) -> float:
    """The longest one blocking command may wait on this client's connections."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(client, redis.cluster.RedisCluster):
        pool = client.nodes_manager  # holds the connection kwargs of every node
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    socket_timeout = kwargs.get("socket_timeout")
    if not socket_timeout:
        return MAX_WAIT_CHUNK
    return max(MIN_WAIT_CHUNK, min(MAX_WAIT_CHUNK, float(socket_timeout) * SOCKET_TIMEOUT_SHARE))


#: What redis-py and the socket layer raise when Redis fails or is unreachable.
BACKEND_ERRORS = (RedisError, OSError)


def backend_error(name: str, exc: BaseException) -> LockBackendError:
    """The ``LockBackendError`` for ``exc``; raise it ``from exc``."""
    kind = "failed" if isinstance(exc, RedisError) else "is unreachable"
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        kind = "is unreachable"
    return LockBackendError(
        f"Redis {kind} for lock {name!r}: {type(exc).__name__}: {exc}", name=name
    )


@contextlib.contextmanager
def translate_errors(name: str) -> Iterator[None]:
    """Turn redis-py and socket failures into ``LockBackendError``, cause chained."""
    try:
        yield
    except BACKEND_ERRORS as exc:
        raise backend_error(name, exc) from exc


@contextlib.asynccontextmanager
async def translate_errors_async(name: str) -> AsyncIterator[None]:
    with translate_errors(name):
        yield


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (one command cannot span hash slots)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def scan(client: Any, match: str, *, count: int = 1000) -> Iterator[bytes | str]:
    """Every key matching ``match``, by SCAN in batches (never KEYS).

    On a Redis Cluster every primary is scanned in turn: each holds only the
    keys of its own slots.
    """
    if isinstance(client, redis.cluster.RedisCluster):
        cluster: Any = client  # partly untyped in redis-py
        for node in cluster.get_primaries():
            yield from scan(cluster.get_redis_connection(node), match, count=count)
        return
    cursor: int = 0
    while True:
        cursor, batch = client.scan(cursor=cursor, match=match, count=count)
        yield from batch
        if not cursor:
            return


def blpop(client: Any, key: str | bytes, timeout: float) -> tuple[bytes, bytes] | None:
    """``BLPOP`` of one list: ``(key, value)``, or ``None`` when ``timeout`` passed."""
    reply = client.blpop([key], timeout=timeout)
    return None if reply is None else (reply[0], reply[1])


# --- asyncio clients ---------------------------------------------------------

_ASYNC_CONNECTION_CLASSES: dict[type[Any], type[Any]] = {
    redis.connection.Connection: redis.asyncio.connection.Connection,
    redis.connection.SSLConnection: redis.asyncio.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: (
        redis.asyncio.connection.UnixDomainSocketConnection
    ),
}


#: Connection arguments that are objects of the sync client (its parser class; redis-py >= 7
#: adds maintenance-notification handlers there); the asyncio pool makes its own.
_NOT_MIRRORED = frozenset({"retry", "redis_connect_func", "self", "parser_class"})
_SYNC_ONLY_PREFIXES = ("maint_notifications", "oss_cluster_maint_notifications", "orig_")


class _LoopClients:
    """One event loop's asyncio clients, closed while that loop shuts down.

    ``asyncio.run`` and asgiref's ``async_to_sync`` finalise a loop's async
    generators before closing it; one generator per loop, parked at its
    ``yield``, closes the clients' connections there. Without it a loop per
    call (async views under WSGI) would leak a loop and a Redis connection
    per call.
    """

    def __init__(self, owner: _AsyncClients, loop: asyncio.AbstractEventLoop) -> None:
        self.clients: dict[int, tuple[Any, Any]] = {}
        self.retired: list[Any] = []
        closer = self._close_at_shutdown(owner, loop)
        self._closer = closer
        self._started = loop.create_task(self._start(closer))

    @staticmethod
    async def _start(closer: AsyncIterator[None]) -> None:
        await closer.__anext__()  # first iteration registers it with the loop

    async def _close_at_shutdown(
        self, owner: _AsyncClients, loop: asyncio.AbstractEventLoop
    ) -> AsyncIterator[None]:
        try:
            yield
        finally:
            owner._forget(loop, self)
            for client in [*(c for _, c in self.clients.values()), *self.retired]:
                with contextlib.suppress(Exception):
                    await client.connection_pool.disconnect()


class _AsyncClients:
    """asyncio clients mirroring sync pools, one per (event loop, pool).

    asyncio connections belong to the loop that opened them. A loop's clients
    are closed and forgotten when the loop shuts down (see ``_LoopClients``);
    a loop closed without that step is forgotten the next time a loop needs a
    client, and its sockets close when it is garbage collected.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, _LoopClients] = {}

    def get(self, sync_client: Any) -> Any | None:
        pool = getattr(sync_client, "connection_pool", None)
        if pool is None:  # Redis Cluster: a pool per node, no asyncio mirror here
            return None
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._by_loop.get(loop)
            found = entry.clients.get(id(pool)) if entry is not None else None
            if found is not None and found[0] is pool:
                return found[1]
        client = self._build(pool)
        if client is None:
            return None
        # No await since the lookup: no other task of this loop got in between.
        with self._lock:
            entry = self._by_loop.get(loop)
            if entry is None:
                for closed in [other for other in self._by_loop if other.is_closed()]:
                    del self._by_loop[closed]
                entry = self._by_loop[loop] = _LoopClients(self, loop)
            replaced = entry.clients.get(id(pool))
            if replaced is not None:  # a pool that was replaced (new settings)
                entry.retired.append(replaced[1])
            entry.clients[id(pool)] = (pool, client)
        return client

    def _forget(self, loop: asyncio.AbstractEventLoop, entry: _LoopClients) -> None:
        with self._lock:
            if self._by_loop.get(loop) is entry:
                del self._by_loop[loop]

    def loops(self) -> int:
        """How many event loops have clients now (for tests and soaks)."""
        return len(self._by_loop)

    @staticmethod
    def _build(pool: Any) -> Any | None:
        if type(pool) is not redis.connection.ConnectionPool:
            return None  # Sentinel, Cluster, custom pools: the caller falls back
        async_class = _ASYNC_CONNECTION_CLASSES.get(pool.connection_class)
        if async_class is None:
            return None
        accepted = set(inspect.signature(async_class.__init__).parameters)
        for base in async_class.__mro__[1:]:
            init = base.__dict__.get("__init__")
            if init is not None:
                accepted |= set(inspect.signature(init).parameters)
        kwargs = {
            k: v
            for k, v in pool.connection_kwargs.items()
            if k in accepted and k not in _NOT_MIRRORED and not k.startswith(_SYNC_ONLY_PREFIXES)
        }
        async_pool = redis.asyncio.ConnectionPool(connection_class=async_class, **kwargs)
        return redis.asyncio.Redis(connection_pool=async_pool)


_async_clients = _AsyncClients()


def get_async_client(sync_client: Any) -> Any | None:
    """An asyncio client to the same server as ``sync_client``, or ``None``.

    ``None`` means the topology has no asyncio mirror here; callers then run the
    synchronous client in a worker thread.
    """
    return _async_clients.get(sync_client)


# --- one script on several independent servers at once (Redlock) -------------


def run_on_all(
    clients: list[Any],
    script: Script,
    keys: Sequence[str | bytes],
    args: list[Any],
    *,
    timeout: float | None,
) -> list[Any]:
    """Run ``script`` on every client concurrently; one result or exception each.

    The request is written to every server before any reply is read, so N
    servers cost about one round trip, without threads. A reply that has not
    arrived ``timeout`` seconds after the requests were sent counts as a
    ``redis.TimeoutError`` (its connection is dropped, so a late reply can never
    be read as the answer to a later command). Clients without a plain
    connection pool (Sentinel, Cluster) are called one after the other.
    """
    results: list[Any] = [None] * len(clients)
    pending: list[tuple[int, Any, Any, Any]] = []
    for index, client in enumerate(clients):
        pool = getattr(client, "connection_pool", None)
        if type(pool) is not redis.connection.ConnectionPool:
            results[index] = _run_one(client, script, keys, args)
            continue
        try:
            conn: Any = _pool_connection(pool)
        except BACKEND_ERRORS as exc:
            results[index] = exc
            continue
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except BACKEND_ERRORS as exc:
            conn.disconnect()
            pool.release(conn)
            results[index] = exc
            continue
        pending.append((index, client, pool, conn))
    sent = time.monotonic()
    for index, client, pool, conn in pending:
        # A stalled server may cost at most its own socket timeout, never the
        # whole ``timeout``: the healthy majority's answers are still in time.
        limit = _reply_limit(timeout, pool.connection_kwargs.get("socket_timeout"))
        retry = False
        try:
            if limit is not None and not conn.can_read(
                timeout=max(0.0, sent + limit - time.monotonic())
            ):
                raise redis.TimeoutError(f"no reply within {limit:.3f}s")
            results[index] = conn.read_response()
        except NoScriptError:
            retry = True
        except BACKEND_ERRORS as exc:
            conn.disconnect()
            results[index] = exc
        finally:
            pool.release(conn)
        if retry:  # first use of the script on this server
            results[index] = _run_one(client, script, keys, args)
    return results


def _reply_limit(timeout: float | None, socket_timeout: float | None) -> float | None:
    limits = [t for t in (timeout, socket_timeout) if t]
    return min(limits) if limits else None


def _pool_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 requires a command name
        return pool.get_connection("EVALSHA")


def _run_one(client: Any, script: Script, keys: Sequence[str | bytes], args: list[Any]) -> Any:
    try:
        return script(client, keys, args)
    except BACKEND_ERRORS as exc:
        return exc
