"""One wake-up connection per server, shared by every waiter of the process.

A waiter used to block on its own signal list with ``BLPOP``, on a connection
of the cache's pool for the whole wait: N waiters held N connections, and past
the pool's cap (100 by default in redis-py 8) a busy lock failed its acquires
with ``MaxConnectionsError`` while Redis idled. Now a waiter joins a
``Waker`` with its signal key and waits on a local event. The waker is one
thread per server (per hash slot on a Redis Cluster, where one blocking
command cannot span slots) that ``BLPOP``s every joined key at once, plus a
control list of its own: a waiter whose key is not in the ``BLPOP`` under way
nudges it there (``WAKE``), so it starts again with the new key. What it pops
it hands to that key's waiter: a handoff's fencing token or a wake-up, the
very reply the waiter's own ``BLPOP`` of the same list would have read, so
neither the protocol (``engine/steps.py``) nor the scripts changed.

Why nothing is lost:

- a signal pushed before its key is in the ``BLPOP`` stays in its list until
  the next one, which the nudge starts at once;
- a signal popped for a waiter that stopped waiting (its wait ran out, it was
  cancelled) is dropped: that waiter's next step is an acquire attempt, which
  finds a lock handed to it its own (``handed_over`` in ``lock_acquire.lua``),
  or its clean-up, whose cancel script passes such a lock on;
- the wake-up connection failing (Redis restarted, hung, cut off) costs
  wake-ups, never correctness: every wait is bounded (``steps.wait_seconds``)
  and ends in the re-check that was always the fallback for a lost wake-up.
  A hung server stalls only the waiters on it: each server has its own waker.

Threads: one per server (or slot) with waiters, ending ``IDLE_EXIT`` seconds
after its last waiter left. Connections: the one its ``BLPOP`` holds, from the
cache's own pool. Neither grows with the number of waiters. A forked child
starts with none (``Lifecycle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
import weakref
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.engine import pool
from django_redislock.engine.threads import Lifecycle

logger = logging.getLogger(__name__)

#: A waker with no waiter for this long ends its thread.
IDLE_EXIT = 10.0
#: How long a control list outlives a process that died before reading it.
CONTROL_TTL_MS = 60_000
#: The first pause after a failed ``BLPOP`` (doubling up to the wait chunk):
#: a server that is down or restarting sends no signal to wait for.
RETRY_DELAY = 0.01
#: Wakers kept before the table starts over (clients replaced by new settings).
MAX_WAKERS = 1024

Signal = tuple[Any, Any]


class SyncWaiter:
    """A thread waiting for its signal key; ``signal`` once delivered."""

    __slots__ = ("_done", "key", "signal")

    def __init__(self, key: str) -> None:
        self.key = key
        self.signal: Signal | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def deliver(self, signal: Signal) -> None:
        """From the waker's thread, under its mutex (so at most once)."""
        self.signal = signal
        self._done.release()

    def wait(self, timeout: float) -> None:
        self._done.acquire(timeout=max(timeout, 0.0))


class AsyncWaiter:
    """A task waiting for its signal key, on the loop it was made on."""

    __slots__ = ("_future", "_loop", "key", "signal")

    def __init__(self, key: str) -> None:
        self.key = key
        self.signal: Signal | None = None
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()

    def deliver(self, signal: Signal) -> None:
        self.signal = signal
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(_settle, self._future)

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._future, max(timeout, 0.0))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


Waiter = SyncWaiter | AsyncWaiter


class Waker:
    """One server's (or slot's) shared ``BLPOP`` over its waiters' signal keys."""

    def __init__(self, client: Any, control: str, chunk: float, life: Lifecycle) -> None:
        self.client = client
        #: This waker's own list: a nudge pushes to it, ending the ``BLPOP``.
        self.control = control
        #: How long one ``BLPOP`` blocks: a share of the socket timeout, so
        #: the client never cuts a healthy one.
        self.chunk = chunk
        self._life = life
        self._mutex = threading.Lock()
        self._joined = threading.Condition(self._mutex)
        self._waiters: dict[str, Waiter] = {}
        #: The keys of the ``BLPOP`` under way; whether it was nudged since it began.
        self._listening: frozenset[str] = frozenset()
        self._nudged = False
        self._idle = False
        self._running = False

    def join(self, waiter: Waiter) -> bool:
        """Listen for ``waiter``'s key; whether the caller must nudge (``WAKE``
        the control list): the ``BLPOP`` under way does not list it."""
        with self._mutex:
            self._waiters[waiter.key] = waiter
            if not self._running:
                self._running = self._life.start(self._listen) is not None
                return False  # its first BLPOP lists the key (or none runs: the re-check)
            if self._idle:
                self._joined.notify()
                return False
            if self._nudged or waiter.key in self._listening:
                return False
            self._nudged = True
            return True

    def leave(self, waiter: Waiter) -> Signal | None:
        """Stop listening for ``waiter``; its signal, if one came meanwhile."""
        with self._mutex:
            if self._waiters.get(waiter.key) is waiter:
                del self._waiters[waiter.key]
        return waiter.signal

    def waiters(self) -> int:
        return len(self._waiters)

    def _keys(self) -> list[str] | None:
        """The keys of the next ``BLPOP``, once there is a waiter; ``None``
        after ``IDLE_EXIT`` seconds without one (the thread ends)."""
        with self._mutex:
            while not self._waiters:
                self._idle = True
                try:
                    self._joined.wait(IDLE_EXIT)
                finally:
                    self._idle = False
                if not self._waiters:
                    self._running = False
                    return None
            keys = list(self._waiters)
            self._listening = frozenset(keys)
            self._nudged = False
        keys.append(self.control)
        return keys

    def _listen(self) -> None:
        delay = 0.0
        while True:
            keys = self._keys()
            if keys is None:
                return
            try:
                reply = pool.call(self.client, None, self.client.blpop, keys, self.chunk)
            except backend.BACKEND_ERRORS as exc:
                delay = min(self.chunk, max(RETRY_DELAY, 2 * delay))
                level = logging.DEBUG if delay > RETRY_DELAY else logging.WARNING
                logger.log(
                    level,
                    "The shared wake-up connection failed (%s: %s); its %d waiter(s) re-check "
                    "on their own until it answers again.",
                    type(exc).__name__,
                    exc,
                    len(keys) - 1,
                )
                time.sleep(delay)
                continue
            delay = 0.0
            if reply is not None:
                self._deliver(backend.as_text(reply[0]), reply)

    def _deliver(self, key: str, signal: Signal) -> None:
        with self._mutex:
            waiter = self._waiters.pop(key, None)
            if waiter is not None:
                waiter.deliver(signal)


def control_key(signal_key: str) -> str:
    """A waker's control list, in the hash slot of ``signal_key`` (the first
    key it served) and under the same prefix: ``<prefix>:{<name>}:wake:<id>``."""
    tag_end = signal_key.rfind("}:") + 2
    return f"{signal_key[:tag_end]}wake:{uuid.uuid4().hex}"


class Wakeups:
    """The process's wakers, one per (client, hash slot), clients held weakly."""

    def __init__(self) -> None:
        self._life = Lifecycle("django-redislock-wakeups", self._reset)
        self._reset()

    def _reset(self) -> None:
        """None: new, or a forked child's (its parent's threads are not here)."""
        self._mutex = threading.Lock()
        self._wakers: dict[tuple[int, int | None], tuple[Any, Waker]] = {}

    def waker(self, client: Any, key: str) -> Waker:
        """The waker that serves ``key`` on ``client``."""
        self._life.forked()
        slot = client.keyslot(key) if backend.is_cluster(client) else None
        found = self._wakers.get((id(client), slot))
        if found is not None and found[0]() is client:
            return found[1]
        with self._mutex:
            found = self._wakers.get((id(client), slot))
            if found is not None and found[0]() is client:
                return found[1]
            if len(self._wakers) >= MAX_WAKERS:
                self._wakers = {k: v for k, v in self._wakers.items() if v[0]() is not None}
            waker = Waker(client, control_key(key), backend.wait_chunk(client), self._life)
            self._wakers[(id(client), slot)] = (weakref.ref(client), waker)
            return waker

    def join(self, client: Any, waiter: Waiter) -> tuple[Waker, bool]:
        """``waiter`` joins its waker: the waker, and whether to nudge it."""
        waker = self.waker(client, waiter.key)
        return waker, waker.join(waiter)

    def waiters(self) -> int:
        """Waiters listened for, on every server (for tests and soaks)."""
        return sum(waker.waiters() for _, waker in list(self._wakers.values()))


wakeups = Wakeups()
