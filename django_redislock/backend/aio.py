"""asyncio clients that mirror the cache's synchronous connection pools.

``AsyncLock`` and the async permit primitives run their round trips on an
asyncio client of the sync client's own family (``redis.asyncio`` for
redis-py, ``valkey.asyncio`` for valkey-py) built from the sync pool's
connection arguments, one
per (event loop, pool), so a waiting coroutine blocks no thread. Topologies
with no plain pool (Sentinel, Cluster) get ``None``, and their callers run
the synchronous client in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from django_redislock.backend import family

#: Connection arguments that are objects of the sync client (its parser class; redis-py >= 7
#: adds maintenance-notification handlers there); the asyncio pool makes its own.
_NOT_MIRRORED = frozenset(
    {"retry", "redis_connect_func", "valkey_connect_func", "self", "parser_class"}
)
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
        #: id(sync pool) -> (the pool, its asyncio mirror client, the mirror's slots)
        self.clients: dict[int, tuple[Any, Any, asyncio.Semaphore]] = {}
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
            for client in [*(c for _, c, _ in self.clients.values()), *self.retired]:
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
        self._reset()

    def _reset(self) -> None:
        """Empty: new, or a forked child's, whose copy of ``_lock`` may have
        been held by a parent's thread at the fork (never to be let go), and
        whose parent's loops and connections are not its own."""
        self._lock = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, _LoopClients] = {}

    def get(self, sync_client: Any) -> tuple[Any, asyncio.Semaphore] | None:
        """The running loop's mirror of ``sync_client``'s pool, and its slots:
        one per connection its pool may open, taken around every command
        (``engine/connection.AsyncConnection.take``). The pool is this
        package's alone, so they count its connections exactly, and a full
        pool is a wait for a slot, which its caller bounds by its budget,
        instead of redis.asyncio's ``MaxConnectionsError``."""
        pool = getattr(sync_client, "connection_pool", None)
        if pool is None:  # Redis Cluster: a pool per node, no asyncio mirror here
            return None
        loop = asyncio.get_running_loop()
        # Read without the lock (two dict lookups, each atomic): every
        # asyncio command looks its mirror up, and only adding one needs it.
        entry = self._by_loop.get(loop)
        found = entry.clients.get(id(pool)) if entry is not None else None
        if found is not None and found[0] is pool:
            return found[1], found[2]
        client = self._build(pool)
        if client is None:
            return None
        slots = asyncio.Semaphore(max(1, pool.max_connections - SYNC_SHARE))
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
            entry.clients[id(pool)] = (pool, client, slots)
        return client, slots

    def _forget(self, loop: asyncio.AbstractEventLoop, entry: _LoopClients) -> None:
        with self._lock:
            if self._by_loop.get(loop) is entry:
                del self._by_loop[loop]

    def loops(self) -> int:
        """How many event loops have clients now (for tests and soaks)."""
        return len(self._by_loop)

    @staticmethod
    def _build(pool: Any) -> Any | None:
        kin = family.of(pool)
        if type(pool) is not kin.connection_pool:
            return None  # Sentinel, Cluster, custom pools: the caller falls back
        async_class = kin.async_connections.get(pool.connection_class)
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
        size = pool.max_connections
        async_pool = kin.async_module.ConnectionPool(
            connection_class=async_class, max_connections=size, **kwargs
        )
        return kin.async_client(connection_pool=async_pool)


#: Connections of the cache's cap left to the sync pool beside an asyncio
#: mirror: the shared wake-up connection (``engine/wakeups.py``), the watchdog's
#: renewals, the counters' writer and the janitor, so that a process's two
#: pools together stay within the cache's ``max_connections``.
SYNC_SHARE = 4


def size_of(async_client: Any) -> int | None:
    """The cap of an asyncio client's pool."""
    size = getattr(getattr(async_client, "connection_pool", None), "max_connections", None)
    return size if isinstance(size, int) else None


_async_clients = _AsyncClients()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_async_clients._reset)


def mirror(sync_client: Any) -> tuple[Any, asyncio.Semaphore] | None:
    """An asyncio client to the same server as ``sync_client`` and its slots,
    or ``None``: the topology has no asyncio mirror here, and callers run the
    synchronous client in a worker thread."""
    return _async_clients.get(sync_client)
