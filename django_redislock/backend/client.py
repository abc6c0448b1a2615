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

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.cluster
import redis.connection
from django.core.cache import InvalidCacheBackendError, caches
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisClusterException, RedisError

from django_redislock.conf import generation
from django_redislock.exceptions import LockBackendError, LockBackendTimeout

if TYPE_CHECKING:
    pass

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
    """

    def __init__(self) -> None:
        self._entry: tuple[int, dict[str, tuple[Any, float]]] = (-1, {})
        self._namespaces: tuple[int, dict[str, str]] = (-1, {})

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
        if owner != current:
            clients = {}
            self._entry = (current, clients)
        found = clients.get(alias)
        if found is None:
            client = _client_for(alias)
            found = clients[alias] = (client, wait_chunk(client))
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
    """The client and the longest one blocking command may wait on it."""
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
    try:
        if callable(get):  # django-redis
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


#: What redis-py and the socket layer raise when Redis fails or is unreachable
#: (a Redis Cluster none of whose nodes answers raises ``RedisClusterException``,
#: which is no ``RedisError``).
BACKEND_ERRORS = (RedisError, RedisClusterException, OSError)
#: What redis-py raises when it dropped the connection a command was on (it
#: timed out, or the connection broke): the next command needs a new one.
DROPPED = (redis.ConnectionError, redis.TimeoutError, OSError)


def backend_error(name: str, exc: BaseException) -> LockBackendError:
    """The ``LockBackendError`` for ``exc``; raise it ``from exc``."""
    kind = "failed" if isinstance(exc, RedisError) else "is unreachable"
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
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
