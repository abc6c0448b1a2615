"""A Lock's per-name counters, ``acquired``, ``waited``, ``wait_ms`` and ``lost``, batched.

The counters hash (``<prefix>:{<name>}:stats``, see ``backend/scripts/_stats.lua``)
used to be incremented by the acquire script itself. That ``HINCRBY`` was a
sixth of the Redis time of an uncontended acquire+release, paid on every
cycle of every lock for a number an operator reads now and then. So the
client counts instead: each acquire adds to an in-process tally (a dict
increment under a lock), and a daemon thread writes the tally with one
pipelined round trip per client at most once a second (``background.FLUSH_SECONDS``),
at exit, and whenever a reader in this process asks (``flush``: ``manage.py
locks`` and the dashboard do, so their own process's counts are exact).

What that trades, as ``docs/operations.md`` says: another process's counts
show up to a second late, and a process that ends without running its exit
handlers (``SIGKILL``, an unhandled ``SIGTERM``, ``os._exit``) loses its last
second of them. A write is bounded (``WRITE_TIMEOUT``): a hung Redis delays
neither a reader nor the process's exit for longer.

``contended`` stays where it is: the acquire script counts it on a call's
first refusal (a contended acquire is not the cheap path). ``lost`` is
rare, but it is tallied too: it is counted when a lease is reported lost,
often because its server hangs, and a round trip there would hold up the
reports of the other leases waiting behind it.

The thread is started by the first count and exits once a flush finds
nothing new, like the watchdog's; after ``fork()`` the child starts with an
empty tally (it must not write its parent's counts twice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from os import getpid as current_pid
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.engine import bounds
from django_redislock.holds.writer import BackgroundWriter

logger = logging.getLogger(__name__)

#: The longest one client's write may take (a hung Redis: the counts are dropped).
WRITE_TIMEOUT = 2.0


class Tally(BackgroundWriter):
    """Counts not yet written:
    ``(id(client), stats key) -> [client, ttl, acquired, wait_ms, waited, lost]``."""

    thread_name = "django-redislock-counters"
    #: Where the acquires that did not wait go for the per-minute history
    #: (``ops/history.install``): handed over at each flush (``hand_over``).
    on_unwaited: Callable[[dict[str, int]], None] | None = None
    #: Told when the first unwaited acquire since a hand-over is counted (the
    #: history starts its writing thread then, as its own tally would: at
    #: exit only a thread already running can make its last write).
    on_first_unwaited: Callable[[], None] | None = None

    def reset(self) -> None:
        """Forget the tally and the thread (a forked child has neither)."""
        super().reset()
        self._pending: dict[tuple[int, bytes], list[Any]] = {}
        self._unwaited: dict[str, int] = {}

    def acquired_at_once(
        self, client: Any, stats_key: bytes, ttl_ms: int, name: str, pid: int | None = None
    ) -> None:
        """Count one acquire that did not wait, of ``name``, for its counters
        and for the per-minute history (``hand_over``): one increment under
        one lock, instead of the history's own tally behind ``lock_acquired``,
        on the path most acquires take. ``pid``: this process's, when the
        caller has just asked."""
        if self._life.pid != (pid or current_pid()):
            self._forked()
        key = (id(client), stats_key)
        with self._lock:
            entry = self._pending.get(key)
            if entry is None:
                self._pending[key] = [client, ttl_ms, 1, 0, 0, 0]
            else:
                entry[2] += 1
            unwaited = self._unwaited
            first = not unwaited
            unwaited[name] = unwaited.get(name, 0) + 1
            if self._thread is None and self.background:
                self._start()
        if first and self.on_first_unwaited is not None:
            self.on_first_unwaited()

    def take_unwaited(self) -> dict[str, int]:
        """The acquires counted by ``acquired_at_once`` since last taken, by
        name; forgotten here."""
        if self._forked():
            return {}
        with self._lock:
            counts, self._unwaited = self._unwaited, {}
        return counts

    def hand_over(self) -> None:
        """Give the history (``on_unwaited``) the acquires counted by
        ``acquired_at_once`` since the last hand-over."""
        receiver = self.on_unwaited
        counts = self.take_unwaited()
        if counts and receiver is not None:
            try:
                receiver(counts)
            except Exception:  # history keeping must never break counting
                logger.warning("Could not hand the lock history its counts", exc_info=True)

    def flush(self, *, last: bool = False) -> None:
        self.hand_over()
        super().flush(last=last)

    def acquired(self, client: Any, stats_key: bytes, ttl_ms: int, waited: float) -> None:
        """Count one acquire of the name whose counters are ``stats_key``;
        ``waited``: the seconds it waited in line, 0 when it did not (then it
        is not one of the ``waited`` acquires that ``wait_ms`` averages over)."""
        waits = 1 if waited > 0 else 0
        waited_ms = round(waited * 1000) if waits else 0
        if self._life.pid != current_pid():
            self._forked()
        with self._lock:
            entry = self._pending.get((id(client), stats_key))
            if entry is None:
                self._pending[(id(client), stats_key)] = [client, ttl_ms, 1, waited_ms, waits, 0]
            else:
                entry[2] += 1
                entry[3] += waited_ms
                entry[4] += waits
            if self._thread is None and self.background:
                self._start()

    def lost(self, client: Any, stats_key: bytes, ttl_ms: int) -> None:
        """Count one lease of the name reported lost."""
        self._forked()
        with self._lock:
            entry = self._pending.setdefault((id(client), stats_key), [client, ttl_ms, 0, 0, 0, 0])
            entry[5] += 1
            if self._thread is None and self.background:
                self._start()

    def pending(self, client: Any, stats_key: bytes) -> tuple[int, int, int]:
        """``(acquired, wait_ms, waited)`` counted for ``stats_key`` on
        ``client`` and not written yet: a reader on a latency-bound path adds
        them to what it read instead of paying a flush's round trip."""
        self._forked()
        with self._lock:
            entry = self._pending.get((id(client), stats_key))
            return (entry[2], entry[3], entry[4]) if entry is not None else (0, 0, 0)

    def _idle(self) -> bool:
        return not self._pending and not self._unwaited

    def _take(self) -> dict[tuple[int, bytes], list[Any]]:
        pending, self._pending = self._pending, {}
        return pending

    def _write(self, taken: dict[tuple[int, bytes], list[Any]], last: bool) -> None:
        """One pipeline per client, each within ``WRITE_TIMEOUT``; best effort.

        Counts that cannot be written (Redis unreachable or hung) are dropped,
        not retried: they are statistics, and a backlog must not grow while
        Redis is away.
        """
        by_client: dict[int, list[list[Any]]] = {}
        for (client_id, key), entry in taken.items():
            by_client.setdefault(client_id, []).append([key, *entry])
        for entries in by_client.values():
            _write_logged(entries, last)


def _write_logged(entries: list[list[Any]], last: bool) -> None:
    """One client's counts (``_write``); a failure is logged, never raised."""
    try:
        _write(entries[0][1], entries, last)
    except (*backend.BACKEND_ERRORS, TimeoutError) as exc:
        logger.debug("Could not write %d names' lock counters: %s", len(entries), exc)
    except Exception:  # a bug here must not stop the thread, nor reach a lock
        logger.warning("Could not write lock counters", exc_info=True)


def _write(client: Any, entries: list[list[Any]], last: bool) -> None:
    """One client's counts, within ``WRITE_TIMEOUT`` (``bounds``: a sibling
    client with that socket timeout, or a worker thread where there is none;
    here, at exit, where ``close`` does the waiting)."""

    def write(target: Any) -> None:
        pipe = target.pipeline(transaction=False)
        for key, _, ttl_ms, acquired, wait_ms, waited, lost in entries:
            if acquired:
                pipe.hincrby(key, "acquired", acquired)
            if lost:
                pipe.hincrby(key, "lost", lost)
            if waited:
                pipe.hincrby(key, "waited", waited)
            if wait_ms:
                pipe.hincrby(key, "wait_ms", wait_ms)
            pipe.pexpire(key, ttl_ms)
        pipe.execute()

    bounds.within(client, WRITE_TIMEOUT, write, here=last)


#: The process's tally.
TALLY = Tally()

#: Count one acquire (``Tally.acquired``).
acquired = TALLY.acquired
#: Count one acquire that did not wait, for the history too (``Tally.acquired_at_once``).
acquired_at_once = TALLY.acquired_at_once
#: Count one lease reported lost (``Tally.lost``).
lost = TALLY.lost
#: Write this process's pending counts now (before reading counters).
flush = TALLY.flush
#: This process's counts of a name not written yet (``Tally.pending``).
pending = TALLY.pending
