"""The process's one tally of lock use: each name's counters and its per-minute
history, counted in memory and written by one daemon thread.

Two things are kept in Redis, and both are written from here:

- a name's counters, ``acquired``, ``waited``, ``wait_ms`` and ``lost`` (and
  ``held`` / ``held_ms``, the calls ``@require_slot`` ran and their time), in
  its hash ``<prefix>:{<name>}:stats`` (see ``backend/scripts/_stats.lua``):
  totals since the name was last idle, what ``manage.py locks`` and the
  dashboard show and the 423 answer's Retry-After averages;
- the per-minute history of the dashboard's "hot names" panel: how often
  each name was acquired, waited for, timed out and lost, the time waited
  and a histogram of waits, in one hash per minute,
  ``<prefix>:{~hot}:minute:<unix minute>``, with fields ``<name>\\x1f<counter>``
  (names cannot hold control characters), kept for ``KEEP_SECONDS``.

The acquire scripts once did the first (``HINCRBY``: a sixth of the Redis
time of an uncontended cycle, paid on every cycle for a number an operator
reads now and then), and receivers of the lock signals the second. Now a
primitive calls the tally where it knows what happened: one entry per
(client, name), a list of counts in fixed places, so counting is a few list
increments under one lock, and field names are built only when writing.
The thread, started by the first count, writes the tally at most once a
second (``FLUSH_SECONDS``), one pipeline per client carrying the names'
hashes and, on the client the history goes to, the minute's hash; and at
exit, and whenever a reader in this process asks (``flush``: ``manage.py
locks`` and the dashboard do, so their own process's counts are exact).
A name's counters are kept only for kinds with a ``stats`` part (``Lock``
and what is built on it); the history has every kind. ``contended`` stays in
the acquire script: it is counted on a call's first refusal, not the cheap path.

What that trades, as ``docs/operations.md`` says: another process's counts
show up to a second late; the history's minute is the process's wall clock
at the write, so up to a second late too; a process that ends without its
exit handlers (``SIGKILL``, an unhandled ``SIGTERM``, ``os._exit``) loses its
last second. A write is bounded (``WRITE_TIMEOUT``), and what cannot be
written is dropped, not retried: they are statistics, and a backlog must not
grow while Redis is away. The last write, at exit, cannot be bounded by
waiting on a new thread (Python 3.12 refuses them while shutting down), so
the writing thread, already running, makes it (``close``) and the exit waits
for it at most ``EXIT_WAIT``. The thread's lifecycle is ``engine/threads.py``'s;
a child of ``fork()`` starts with an empty tally (it must not write its
parent's counts twice): every entry point asks ``_forked`` first.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from os import getpid as current_pid
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.engine import bounds
from django_redislock.engine.threads import Lifecycle

logger = logging.getLogger(__name__)

#: Seconds between writes.
FLUSH_SECONDS = 1.0
#: The longest one client's write may take (a hung Redis: the counts are dropped).
WRITE_TIMEOUT = 2.0
#: The longest the process's exit waits for the last write.
EXIT_WAIT = 2.0
#: How long a minute of history is kept.
KEEP_SECONDS = 65 * 60
#: Upper bounds (ms) of the history's wait histogram's buckets; the last is open.
WAIT_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000)
#: The history's counters, per name and minute.
COUNTERS = ("acquired", "waits", "timeouts", "lost", "wait_ms")
SEP = "\x1f"


def minute_key(prefix: str, minute: int) -> str:
    return backend.key(prefix, "~hot", f"minute:{minute}")


def bucket(waited_ms: float) -> int:
    return bisect.bisect_left(WAIT_BUCKETS_MS, waited_ms)


# An entry: where its counters go, then its counts. The name's counters'
# ``waited`` counts acquires that waited at all, the history's ``waits`` those
# that waited 1 ms or more and the waiters that gave up, hence two of each.
_CLIENT, _KEY, _TTL, _NAME = range(4)
_ACQUIRED, _WAIT_MS, _WAITED, _LOST, _HELD, _HELD_MS, _WAITS, _TIMEOUTS, _WAITS_MS = range(4, 13)
_HISTOGRAM = 13
_ZEROS = [0] * (_HISTOGRAM - _ACQUIRED + len(WAIT_BUCKETS_MS) + 1)
#: The name's hash's fields, by their place in an entry.
_STATS = (
    ("acquired", _ACQUIRED), ("lost", _LOST), ("waited", _WAITED),
    ("wait_ms", _WAIT_MS), ("held", _HELD), ("held_ms", _HELD_MS),
)  # fmt: skip
#: The history's fields of a name, by their place in an entry: the counters,
#: then the wait histogram's buckets.
_MINUTE = (
    ("acquired", _ACQUIRED), ("waits", _WAITS), ("timeouts", _TIMEOUTS),
    ("lost", _LOST), ("wait_ms", _WAITS_MS),
    *((f"w{i}", _HISTOGRAM + i) for i in range(len(WAIT_BUCKETS_MS) + 1)),
)  # fmt: skip
FIELDS = tuple(field for field, _ in _MINUTE)


def _history_target() -> tuple[Any, str]:
    """Where the history goes: the lock cache's namespace (its ``KEY_PREFIX``
    and ``VERSION`` too), which the dashboard reads (``ops.connect``)."""
    settings = get_settings()
    client = backend.get_client(settings.cache)
    return client, backend.namespace(settings.cache, settings.key_prefix)


class Tally:
    """Counts not yet written, per ``(id(client), stats key)``, or per name
    for a kind with no counters of its own (history only); ``background``
    off: only ``flush`` writes. ``clock`` and ``history`` (the client and
    prefix it goes to) are the tests'."""

    thread_name = "django-redislock-counters"

    def __init__(
        self,
        *,
        background: bool = True,
        clock: Callable[[], float] = time.time,
        history: Callable[[], tuple[Any, str]] = _history_target,
    ) -> None:
        self.background = background
        self._clock = clock
        self._history = history
        self.reset()
        self._life = Lifecycle(self.thread_name, self.reset, at_exit=self.close)

    def reset(self) -> None:
        """Forget the tally and the thread (a forked child has neither)."""
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # see ``flush``
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # set by ``close``
        self._closing = False
        self._closed = threading.Event()
        self._pending: dict[Any, list[Any]] = {}

    def _forked(self) -> bool:
        """Whether this is a child forked without the hooks: then reset."""
        return self._life.forked()

    def _entry(self, client: Any, stats_key: bytes | None, ttl_ms: int, name: str) -> Any:
        """The entry to count in (``_lock`` held), started if new; ``None``
        when nothing is kept (no counters, and no history: counting is off)."""
        key = name if stats_key is None else (id(client), stats_key)
        entry = self._pending.get(key)
        if entry is None:
            if stats_key is None and not get_settings().stats:
                return None
            entry = self._pending[key] = [client, stats_key, ttl_ms, name, *_ZEROS]
        if self._thread is None and self.background:  # a refused start: tried again
            self._thread = self._life.start(self._run)
        return entry

    def acquired(
        self,
        client: Any,
        stats_key: bytes | None,
        ttl_ms: int,
        name: str,
        waited: float = 0.0,
        pid: int | None = None,
    ) -> None:
        """Count one acquire of ``name`` (its counters are ``stats_key``'s, if
        any); ``waited``: the seconds it waited in line, 0 when it did not (then it
        is not one of the ``waited`` acquires that ``wait_ms`` averages over).
        ``pid``: this process's, when the caller has just asked."""
        if self._life.pid != (pid or current_pid()):
            self._forked()
        key = name if stats_key is None else (id(client), stats_key)
        with self._lock:
            entry = self._pending.get(key)
            if entry is None or self._thread is None:  # not on every acquire: a call's cost
                entry = self._entry(client, stats_key, ttl_ms, name)
                if entry is None:
                    return
            entry[_ACQUIRED] += 1
            if waited <= 0:  # most acquires: the lock was free
                entry[_HISTOGRAM] += 1
                return
            waited_ms = waited * 1000
            entry[_WAITED] += 1
            entry[_WAIT_MS] += round(waited_ms)
            if waited_ms < 1:  # the history counts waits from 1 ms
                entry[_HISTOGRAM] += 1
            else:
                entry[_WAITS] += 1
                entry[_WAITS_MS] += round(waited_ms)
                entry[_HISTOGRAM + bucket(waited_ms)] += 1

    def contended(self, name: str, waited: float) -> None:
        """A waiter of ``name`` gave up after ``waited`` seconds: a wait and a
        timeout of the history, in its wait histogram too: left out, a name
        whose waiters mostly give up after seconds showed the short waits of
        the few that got it as its p50 and p95."""
        waited_ms = max(0.0, waited) * 1000
        self._forked()
        with self._lock:
            entry = self._entry(None, None, 0, name)
            if entry is not None:
                entry[_WAITS] += 1
                entry[_TIMEOUTS] += 1
                entry[_WAITS_MS] += round(waited_ms)
                entry[_HISTOGRAM + bucket(waited_ms)] += 1

    def lost(self, client: Any, stats_key: bytes | None, ttl_ms: int, name: str) -> None:
        """Count one lease of ``name`` reported lost."""
        self._forked()
        with self._lock:
            entry = self._entry(client, stats_key, ttl_ms, name)
            if entry is not None:
                entry[_LOST] += 1

    def held(self, client: Any, stats_key: bytes, ttl_ms: int, name: str, seconds: float) -> None:
        """Count one hold of ``seconds`` that ended (a ``@require_slot`` call):
        what ``holds.estimates.slot_retry_after`` averages, as a lock's 423
        averages the waits."""
        self._forked()
        with self._lock:
            entry = self._entry(client, stats_key, ttl_ms, name)
            entry[_HELD] += 1
            entry[_HELD_MS] += round(seconds * 1000)

    def pending(self, client: Any, stats_key: bytes) -> tuple[int, int, int]:
        """``(acquired, wait_ms, waited)`` counted for ``stats_key`` on
        ``client`` and not written yet: a reader on a latency-bound path adds
        them to what it read instead of paying a flush's round trip."""
        self._forked()
        with self._lock:
            entry = self._pending.get((id(client), stats_key))
            return (
                (0, 0, 0) if entry is None else (entry[_ACQUIRED], entry[_WAIT_MS], entry[_WAITED])
            )

    def pending_held(self, client: Any, stats_key: bytes) -> tuple[int, int]:
        """``(held, held_ms)`` counted for ``stats_key`` and not written yet."""
        self._forked()
        with self._lock:
            entry = self._pending.get((id(client), stats_key))
            return (0, 0) if entry is None else (entry[_HELD], entry[_HELD_MS])

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            self._wake.wait(FLUSH_SECONDS)
            with self._lock:
                if self._thread is not me:  # reset(): another's now
                    if self._closing and self._thread is None:  # close() raced a reset
                        self._closed.set()
                    return
                closing = self._closing
                if not closing and not self._pending:  # nothing new: exit, as the watchdog does
                    self._thread = None
                    return
            if closing:
                try:
                    self.flush(last=True)
                finally:
                    self._closed.set()
                return
            self.flush()

    def flush(self, *, last: bool = False) -> None:
        """Write what is pending; ``last``: from the writing thread at exit,
        which bounds nothing itself (``close`` stops waiting for it).

        Flushes follow each other (``_flushing``): a reader's flush (``locks
        inspect``, the dashboard) that came while the thread wrote what it
        had just taken returned at once, and the read after it missed them."""
        if self._forked():  # the parent's tally is the parent's to write
            return
        with self._flushing:
            with self._lock:
                taken, self._pending = self._pending, {}
            if taken:
                self._write(taken.values(), last)

    def _write(self, entries: Iterable[list[Any]], last: bool) -> None:
        """One pipeline per client: the names' counters, and this minute's
        history on the client it goes to. Never raises: a history that cannot
        be reached (its settings, its client) leaves the counters written."""
        by_client: dict[int, tuple[Any, list[list[Any]], list[list[Any]]]] = {}
        history: list[list[Any]] = []
        for entry in entries:
            if entry[_KEY] is not None:
                by_client.setdefault(id(entry[_CLIENT]), (entry[_CLIENT], [], []))[1].append(entry)
            if entry[_ACQUIRED] or entry[_WAITS] or entry[_LOST]:  # what the history counts
                history.append(entry)
        prefix = ""
        if history:
            try:
                client, prefix = self._history()
            except Exception:  # history keeping must never break counting
                logger.warning("Could not write the per-minute lock history", exc_info=True)
            else:
                by_client.setdefault(id(client), (client, [], []))[2].extend(history)
        minute = int(self._clock() // 60)
        for client, counted, minutes in by_client.values():
            try:
                bounds.within(
                    client, WRITE_TIMEOUT, _writes(counted, minutes, prefix, minute), here=last
                )
            except backend.backend_errors_and(TimeoutError) as exc:
                logger.debug("Could not write %d lock counts: %s", len(counted) + len(minutes), exc)
            except Exception:  # a bug here must not stop the thread, nor reach a lock
                logger.warning("Could not write lock counters", exc_info=True)

    def close(self) -> None:
        """The last write, at exit (``atexit``): made by the writing thread
        where one runs (see the module's docstring), else here."""
        if self._forked():  # the parent's tally is the parent's to write
            return
        with self._lock:
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                self._closing = True
                self._wake.set()
            else:
                thread = None
        if thread is None:
            self.flush()
        elif not self._closed.wait(EXIT_WAIT):
            logger.debug("Gave up on the last write of the lock counters at exit")


def _writes(
    counted: list[list[Any]], minutes: list[list[Any]], prefix: str, minute: int
) -> Callable[[Any], None]:
    """One client's write: the names' hashes, then the minute's."""

    def write(target: Any) -> None:
        pipe = target.pipeline(transaction=False)
        for entry in counted:
            key = entry[_KEY]
            for field, index in _STATS:
                if entry[index]:
                    pipe.hincrby(key, field, entry[index])
            pipe.pexpire(key, entry[_TTL])
        if minutes:
            key = minute_key(prefix, minute)
            for entry in minutes:
                name = entry[_NAME]
                for field, index in _MINUTE:
                    if entry[index]:
                        pipe.hincrby(key, f"{name}{SEP}{field}", entry[index])
            pipe.expire(key, KEEP_SECONDS)
        pipe.execute()

    return write


#: The process's tally.
TALLY = Tally()

#: Count one acquire (``Tally.acquired``).
acquired = TALLY.acquired
#: Count one waiter that gave up (``Tally.contended``).
contended = TALLY.contended
#: Count one lease reported lost (``Tally.lost``).
lost = TALLY.lost
#: Count one ``@require_slot`` call's hold (``Tally.held``).
held = TALLY.held
#: This process's hold counts of a name not written yet (``Tally.pending_held``).
pending_held = TALLY.pending_held
#: Write this process's pending counts now (before reading counters).
flush = TALLY.flush
#: This process's counts of a name not written yet (``Tally.pending``).
pending = TALLY.pending
