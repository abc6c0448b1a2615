"""The one gateway to Redis: clients, key names, error translation, SCAN.

No other module imports django-redis, and only this module and ``scripts``
touch the client's API directly, so a change of client library or topology
(Sentinel, Cluster) is a change here. The client is redis-py's or valkey-py's
(django-valkey): ``family`` says which, and which classes go with it.

Key layout: ``<prefix>:{<name>}:<part>``. The braces make every key of one
primitive share a Redis Cluster hash slot. Braces (and ``%``) inside a name are
percent-encoded, so a name can never end the hash tag early and the encoding is
reversible for display.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
from django.core.cache import InvalidCacheBackendError, caches
from django.core.exceptions import ImproperlyConfigured

from django_redislock.backend import family
from django_redislock.conf import generation
from django_redislock.exceptions import LockBackendError, LockBackendTimeout, LockPoolExhausted

#: The longest a single blocking Redis command may wait when the connection has
#: no socket timeout (the shared wake-up connection's ``BLPOP``,
#: ``engine/wakeups.py``), and the longest a waiter waits before it re-checks
#: with an acquire attempt: the bound on how late a waiter notices a wake-up
#: that was lost. A waiter blocks on no socket of its own, so its re-checks
#: need not follow the socket timeout.
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


def as_text(value: bytes | str) -> str:
    """A reply as text, whichever ``decode_responses`` the cache's pool has."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse_key(prefix: str, raw: str | bytes) -> tuple[str, str] | None:
    """Split a key written by this app into ``(name, part)``; ``None`` for others."""
    text = as_text(raw)
    head = prefix + ":{"
    if not text.startswith(head):
        return None
    end = text.find("}:", len(head))
    if end < 0:
        return None
    return decode_name(text[len(head) : end]), text[end + 2 :]


class _ClientCache:
    """Clients per alias, remembered until ``CACHES`` or ``REDISLOCK`` change.

    Django's cache handler is thread-local and comparatively slow to consult;
    redis-py clients are thread-safe and fork-aware, so one per alias serves the
    whole process. A change of settings (``conf.generation``) empties it.

    One per alias even when threads ask at once: a miss builds under a lock.
    Each thread that missed once built its own cache's client, and what is
    kept per client went with it (two wake-up connections in one process).
    """

    def __init__(self) -> None:
        self._entry: tuple[int, dict[str, tuple[Any, float]]] = (-1, {})
        self._namespaces: tuple[int, dict[str, str]] = (-1, {})
        self._forked()

    def _forked(self) -> None:
        """A new lock in a forked child (another thread may have held the
        parent's at the fork), asked on a miss: a child forked without
        Python's hooks (uWSGI) is seen by its pid."""
        self._building = threading.Lock()
        self._pid = os.getpid()

    def get_namespace(self, alias: str, key_prefix: str) -> str:
        current = generation()
        owner, found = self._namespaces
        if owner != current:
            found = {}
            self._namespaces = (current, found)
        suffix = found.get(alias)
        if suffix is None:
            suffix = found[alias] = _cache_namespace(alias)
        return key_prefix + suffix

    def get(self, alias: str) -> tuple[Any, float]:
        current = generation()
        owner, clients = self._entry
        if owner == current:
            found = clients.get(alias)
            if found is not None:
                return found
        if self._pid != os.getpid():
            self._forked()
        with self._building:
            owner, clients = self._entry
            if owner != current:
                clients = {}
                self._entry = (current, clients)
            found = clients.get(alias)
            if found is None:
                found = clients[alias] = (_client_for(alias), MAX_WAIT_CHUNK)
            return found


_clients = _ClientCache()


def namespace(alias: str, key_prefix: str) -> str:
    """The prefix of every lock key written through the cache ``alias``.

    ``REDISLOCK["KEY_PREFIX"]``, then the cache's own ``KEY_PREFIX`` and
    ``VERSION`` when it sets them (as every other key of that cache carries
    them: django-redis's ``<prefix>:<version>:<key>``), so two sites sharing
    one Redis database, told apart by their caches' ``KEY_PREFIX``, never share
    a lock. A cache with neither (the default) keeps the plain prefix. The
    cache's prefix is percent-encoded like a name, so it can never open or
    close the hash tag that follows.
    """
    return _clients.get_namespace(alias, key_prefix)


def _cache_namespace(alias: str) -> str:
    try:
        cache = caches[alias]
    except InvalidCacheBackendError:
        return ""
    return cache_suffix(getattr(cache, "key_prefix", ""), getattr(cache, "version", 1))


def cache_suffix(prefix: object, version: object) -> str:
    """What a cache's ``KEY_PREFIX`` and ``VERSION`` add to ``REDISLOCK["KEY_PREFIX"]``
    (``namespace``): nothing for a cache that sets neither.

    The version is taken as text, as Django's ``make_key`` formats it into
    every cache key: ``VERSION: "2"`` and ``VERSION: 2`` are one namespace
    there, so they are one here (two Redlock caches differing only so are
    no ``E025``, and a ``Lock`` keeps its keys whichever is written)."""
    prefix = str(prefix or "")
    text = "1" if version is None else str(version)
    if not prefix and text == "1":
        return ""
    return f":{encode_name(prefix)}:{text}"


def get_client(alias: str) -> Any:
    """The synchronous redis-py client behind a cache alias.

    Accepts django-redis caches and Django's built-in ``RedisCache``; anything
    else is an ``ImproperlyConfigured`` naming the alias and its backend.
    """
    return _clients.get(alias)[0]


def get_client_and_chunk(alias: str) -> tuple[Any, float]:
    """The client and the longest a waiter on it waits before it re-checks."""
    return _clients.get(alias)


def _client_for(alias: str) -> Any:
    try:
        cache = caches[alias]
    except InvalidCacheBackendError as exc:
        raise ImproperlyConfigured(
            f"(django_redislock.E003) cache alias {alias!r} is not defined in CACHES."
        ) from exc
    backend = f"{type(cache).__module__}.{type(cache).__qualname__}"
    client = getattr(cache, "client", None)
    get = getattr(client, "get_client", None)
    refused = _refusal(alias, backend, client, get)
    if refused is not None:
        raise ImproperlyConfigured(refused)
    try:
        if callable(get):  # django-redis, django-valkey
            return get(write=True)
        inner = getattr(cache, "_cache", None)  # django.core.cache.backends.redis
        if inner is not None and callable(getattr(inner, "get_client", None)):
            return inner.get_client(None, write=True)
    except (NotImplementedError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"(django_redislock.E022) cache {alias!r} ({backend}) cannot give a raw Redis "
            f"connection; use django-redis's DefaultClient or SentinelClient."
        ) from exc
    raise ImproperlyConfigured(
        f"(django_redislock.E004) cache {alias!r} uses {backend}, which is not Redis-backed; "
        f"use django_redis.cache.RedisCache or django_valkey.cache.ValkeyCache."
    )


#: Modules of the cache clients that spread keys over servers (no one connection).
_SHARDED = ("django_redis.client.sharded", "django_valkey.client.sharded")


def _refusal(alias: str, backend: str, client: object, get: object) -> str | None:
    """Why the cache client cannot serve the locks, as ``checks`` says it (E022,
    E028) for the first use that runs without them; ``None`` if it can.

    django-valkey's ``ShardClient.get_client()`` answers with one of its
    shards instead of failing, and its async cache's is a coroutine: neither
    may be called to find out."""
    if any(cls.__module__ in _SHARDED for cls in type(client).__mro__):
        return (
            f"(django_redislock.E022) cache {alias!r} ({backend}) uses a ShardClient, which "
            f"cannot give the single connection a lock needs; use its DefaultClient."
        )
    if inspect.iscoroutinefunction(get):
        return (
            f"(django_redislock.E028) cache {alias!r} ({backend}) is an asyncio-only cache, "
            f"whose client cannot serve a Lock; give the locks a django_valkey.cache."
            f"ValkeyCache alias on the same server (AsyncLock runs on an asyncio client "
            f"of its own)."
        )
    return None


def wait_chunk(client: Any) -> float:
    """The longest one blocking command may wait on this client's connections
    (a share of their socket timeout, so the client never cuts a healthy one)."""
    pool = getattr(client, "connection_pool", None)
    if family.is_cluster(client):
        pool = client.nodes_manager  # holds the connection kwargs of every node
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    socket_timeout = kwargs.get("socket_timeout")
    if not socket_timeout:
        return MAX_WAIT_CHUNK
    return max(MIN_WAIT_CHUNK, min(MAX_WAIT_CHUNK, float(socket_timeout) * SOCKET_TIMEOUT_SHARE))


if TYPE_CHECKING:
    #: What the client library (redis-py, and valkey-py once a valkey-py client
    #: exists: ``family.loaded``) and the socket layer raise when Redis fails or
    #: is unreachable (a cluster none of whose nodes answers raises
    #: ``RedisClusterException``, which is no ``RedisError``). Read on access
    #: (``__getattr__``), as ``except backend.BACKEND_ERRORS`` does only when an
    #: error is being handled.
    BACKEND_ERRORS: tuple[type[BaseException], ...]
    #: What the client library raises when it dropped the connection a command
    #: was on (it timed out, or the connection broke): the next command needs a
    #: new one.
    DROPPED: tuple[type[BaseException], ...]
    #: What a command cut by a socket timeout or ``asyncio.timeout`` raises.
    TIMEOUTS: tuple[type[BaseException], ...]
else:

    def _timeouts() -> tuple[type[BaseException], ...]:
        return (*family.timeouts(), TimeoutError, asyncio.TimeoutError)

    _FAMILY_TUPLES = {
        "BACKEND_ERRORS": family.backend_errors,
        "DROPPED": family.dropped,
        "TIMEOUTS": _timeouts,
    }

    def __getattr__(name: str) -> Any:
        found = _FAMILY_TUPLES.get(name)
        if found is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return found()


def backend_errors_and(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """``BACKEND_ERRORS`` and ``more``, for an ``except`` that catches both."""
    return (*family.backend_errors(), *more)


#: The client library's error for a pool at its cap (``MaxConnectionsError``
#: since redis-py 5.1 and in valkey-py; redis-py 5.0 raised a plain
#: ``ConnectionError`` with the same text): ``Family.max_connections_error``.
_POOL_MESSAGES = frozenset({"Too many connections", "No connection available."})


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the client's pool had no connection to give (its
    cap reached; a ``BlockingConnectionPool``'s own wait ran out): this
    process's limit, not a Redis failure."""
    if isinstance(exc, PoolExhausted):
        return True
    for kin in family.loaded():
        if kin.max_connections_error is not None and isinstance(exc, kin.max_connections_error):
            return True
        if isinstance(exc, kin.connection_error) and str(exc) in _POOL_MESSAGES:
            return True
    return False


def pool_size(client: Any) -> int | None:
    """The cap of ``client``'s connection pool (``None`` where it has no single pool)."""
    size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    return size if isinstance(size, int) else None


class PoolExhausted(redis.ConnectionError):
    """No connection of the cache's pool came free within a command's budget
    (``engine/pool.py``): every one was in use in this process. Never sent,
    the command needs no clean-up; an acquire counts it as a timeout."""

    def __init__(self, message: str, max_connections: int | None = None) -> None:
        super().__init__(message)
        self.max_connections = max_connections


#: Where an operator sets the size of a cache's pool.
POOL_SETTING = (
    "OPTIONS {'max_connections': N} on Django's RedisCache, "
    "OPTIONS {'CONNECTION_POOL_KWARGS': {'max_connections': N}} on django-redis "
    "or django-valkey"
)


def exhausted_error(name: str, exc: BaseException) -> LockPoolExhausted:
    """The error of a command that found no free connection; raise it ``from exc``."""
    size = getattr(exc, "max_connections", None)
    cap = f"all {size} connections" if size else "every connection"
    return LockPoolExhausted(
        f"The cache's connection pool is exhausted for lock {name!r}: {cap} of this "
        f"process's pool are in use (Redis itself was not asked). Give the pool room for "
        f"every thread that uses the cache at once, plus one per Redis server for waiting: "
        f'{POOL_SETTING} (docs/operations.md, "Pool sizing").',
        name=name,
        max_connections=size,
    )


def backend_error(name: str, exc: BaseException) -> LockBackendError:
    """The ``LockBackendError`` for ``exc``; raise it ``from exc``."""
    if pool_exhausted(exc):
        return exhausted_error(name, exc)
    kind = "failed" if isinstance(exc, family.library_errors()) else "is unreachable"
    if isinstance(exc, family.connection_errors()):
        kind = "is unreachable"
    return LockBackendError(
        f"Redis {kind} for lock {name!r}: {type(exc).__name__}: {exc}", name=name
    )


class Unanswered(redis.TimeoutError):
    """A command cut because the acquire's deadline passed while Redis did not
    answer (``engine/bounds.py``); the timeout that cut it is chained. ``after``: the
    command's future when it is still running on a worker thread."""

    def __init__(self, message: str, after: Any = None) -> None:
        super().__init__(message)
        self.after = after


def unanswered_error(name: str, exc: BaseException) -> LockBackendTimeout:
    """The error of an acquire whose budget ran out while Redis did not answer;
    raise it ``from exc``."""
    return LockBackendTimeout(
        f"Redis did not answer in time for lock {name!r}: the blocking timeout ran out "
        f"while a command was unanswered ({type(exc.__cause__ or exc).__name__}).",
        name=name,
    )


@contextlib.contextmanager
def translate_errors(name: str) -> Iterator[None]:
    """Turn redis-py and socket failures into ``LockBackendError``, cause chained."""
    try:
        yield
    except family.backend_errors() as exc:
        raise backend_error(name, exc) from exc


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (one command cannot span hash slots)."""
    return family.is_cluster(client)


def scan(client: Any, match: str, *, count: int = 1000) -> Iterator[bytes | str]:
    """Every key matching ``match``, by SCAN in batches (never KEYS).

    On a Redis Cluster every primary is scanned in turn: each holds only the
    keys of its own slots.
    """
    if family.is_cluster(client):
        cluster: Any = client  # partly untyped in redis-py
        for node in cluster.get_primaries():
            node_client = family.of(cluster).node_client(cluster, node)
            yield from scan(node_client, match, count=count)
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
