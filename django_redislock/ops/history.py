"""Per-minute contention history for the dashboard's "hot names" panel.

The per-name counters (``backend/scripts/_stats.lua``) are totals since the name was
last idle; they cannot say *when*. This module keeps, per minute, how often
each name was acquired, waited for, timed out and lost, the time waited and a
histogram of waits, written from the lock signals by each process:

- a process adds its signals to an in-memory tally (a dict under a lock), and
  a daemon thread of its own writes the tally with one pipelined round trip
  once a second (``background.FLUSH_SECONDS``) and at exit: a receiver never does I/O,
  so a slow or cut-off Redis never delays a lock, its watchdog or the other
  receivers; the acquire scripts on the hot path are unchanged;
- a minute is one hash, ``<prefix>:{~hot}:minute:<unix minute>``, with fields
  ``<name>\\x1f<counter>`` (names cannot hold control characters), kept for
  ``KEEP_SECONDS`` (65 minutes).

Trade-offs: a process killed with ``SIGKILL`` loses its last second; minutes
are the process's wall clock; every minute of every name is in one hash,
which sits in one hash slot on Redis Cluster. Recording is on with
``REDISLOCK["STATS"]`` (see ``apps.py``) and off with it.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import getpid as current_pid
from typing import Any

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.engine import bounds
from django_redislock.holds import counters
from django_redislock.holds.writer import BackgroundWriter

logger = logging.getLogger(__name__)

KEEP_SECONDS = 65 * 60
#: Upper bounds (ms) of the wait histogram's buckets; the last is open.
WAIT_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000)
COUNTERS = ("acquired", "waits", "timeouts", "lost", "wait_ms")
SEP = "\x1f"


def minute_key(prefix: str, minute: int) -> str:
    return backend.key(prefix, "~hot", f"minute:{minute}")


def bucket(waited_ms: float) -> int:
    return bisect.bisect_left(WAIT_BUCKETS_MS, waited_ms)


#: Field names of a tally entry: the counters, then the wait histogram's buckets.
FIELDS = (*COUNTERS, *(f"w{i}" for i in range(len(WAIT_BUCKETS_MS) + 1)))
_ACQUIRED, _WAITS, _TIMEOUTS, _LOST, _WAIT_MS = range(len(COUNTERS))
_HISTOGRAM = len(COUNTERS)
#: What an acquire that did not wait adds (the first bucket: under 1 ms).
_UNWAITED = ((_ACQUIRED, 1), (_HISTOGRAM, 1))


class Recorder(BackgroundWriter):
    """The in-process tally, flushed to Redis at most once a second.

    A tally entry is a list of counts per ``(minute, name)``, in ``FIELDS``
    order: recording an acquire is a few list increments (about a
    microsecond), and field names are built only when flushing.
    """

    thread_name = "django-redislock-history"

    def __init__(
        self,
        connect: Callable[[], tuple[Any, str]],
        clock: Callable[[], float] = time.time,
        *,
        background: bool = True,
    ) -> None:
        self._connect = connect
        self._clock = clock
        super().__init__(background=background)

    def reset(self) -> None:
        """Forget the tally and the flushing thread (a forked child must not
        write its parent's tally, and has no thread until it records)."""
        super().reset()
        self._tally: dict[tuple[int, str], list[int]] = {}

    def _record(self, name: str, updates: tuple[tuple[int, int], ...]) -> None:
        if not get_settings().stats:
            return
        key = (int(self._clock() // 60), name)
        if self._life.pid != current_pid():
            self._forked()
        with self._lock:
            entry = self._tally.get(key)
            if entry is None:
                entry = self._tally[key] = [0] * len(FIELDS)
            for index, n in updates:
                entry[index] += n
            if self._thread is None and self.background:
                self._start()

    def add_unwaited(self, counts: dict[str, int], *, start: bool = True) -> None:
        """Acquires that did not wait, by name, counted with the counters
        (``counters.acquired_at_once``) and handed over at their flush: in
        the minute of the hand-over, at most a flush (a second) after the
        acquire. ``start=False``: start no writing thread (the caller is
        about to write them: a flush, possibly at exit, when Python 3.12
        refuses new threads)."""
        key_minute = int(self._clock() // 60)
        if self._life.pid != current_pid():
            self._forked()
        with self._lock:
            tally = self._tally
            for name, n in counts.items():
                entry = tally.get((key_minute, name))
                if entry is None:
                    entry = tally[(key_minute, name)] = [0] * len(FIELDS)
                entry[_ACQUIRED] += n
                entry[_HISTOGRAM] += n
            if start and self._thread is None and self.background:
                self._start()

    def wake(self) -> None:
        """Start the writing thread, if it does not run (``counters.on_first_unwaited``)."""
        if self._life.pid != current_pid():
            self._forked()
        with self._lock:
            if self._thread is None and self.background:
                self._start()

    def flush(self, *, last: bool = False) -> None:
        """Write what is tallied, with what the counters hold for the history."""
        if self._tapped():
            counts = counters.TALLY.take_unwaited()
            if counts:
                self.add_unwaited(counts, start=False)  # this flush writes them
        super().flush(last=last)

    def _tapped(self) -> bool:
        return counters.TALLY.on_unwaited == self.add_unwaited

    def stop(self) -> None:
        """Write what is tallied and let the thread end (a newer recorder
        replaces this one: ``install``)."""
        with self._lock:
            self._thread = None
            self.background = False  # a count handed over late starts no thread again
        self.flush()

    def acquired(self, sender: Any, name: str, waited: float = 0.0, **_: Any) -> None:
        waited_ms = waited * 1000 if waited > 0 else 0.0
        if waited_ms < 1:  # most acquires: the lock was free
            self._record(name, _UNWAITED)
        else:
            self._record(
                name,
                (
                    (_ACQUIRED, 1),
                    (_WAITS, 1),
                    (_WAIT_MS, round(waited_ms)),
                    (_HISTOGRAM + bucket(waited_ms), 1),
                ),
            )

    def contended(self, sender: Any, name: str, waited: float = 0.0, **_: Any) -> None:
        """A waiter gave up: a wait, and a timeout, in the wait histogram too:
        left out, a name whose waiters mostly give up after seconds showed
        the short waits of the few that got it as its p50 and p95."""
        waited_ms = max(0.0, waited) * 1000
        self._record(
            name,
            (
                (_WAITS, 1),
                (_TIMEOUTS, 1),
                (_WAIT_MS, round(waited_ms)),
                (_HISTOGRAM + bucket(waited_ms), 1),
            ),
        )

    def lost(self, sender: Any, name: str, **_: Any) -> None:
        self._record(name, ((_LOST, 1),))

    def _take(self) -> dict[tuple[int, str], list[int]]:
        tally, self._tally = self._tally, {}
        return tally

    def _write(self, taken: dict[tuple[int, str], list[int]], last: bool) -> None:
        """One pipelined round trip, within ``counters.WRITE_TIMEOUT`` (a hung
        Redis must not hold a process's exit up for its socket timeout);
        what cannot be written is dropped."""

        def write(client: Any) -> None:
            pipe = client.pipeline(transaction=False)
            for (minute, name), counts in taken.items():
                key = minute_key(prefix, minute)
                for field_name, n in zip(FIELDS, counts, strict=True):
                    if n:
                        pipe.hincrby(key, f"{name}{SEP}{field_name}", n)
            for minute in {minute for minute, _ in taken}:
                pipe.expire(minute_key(prefix, minute), KEEP_SECONDS)
            pipe.execute()

        try:
            client, prefix = self._connect()
            bounds.within(client, counters.WRITE_TIMEOUT, write, here=last)
        except Exception:  # never let history keeping break a lock
            logger.debug("Could not write the per-minute lock history", exc_info=True)


def _connect() -> tuple[Any, str]:
    """Where the history goes: the lock cache's namespace (its ``KEY_PREFIX``
    and ``VERSION`` too), which the dashboard reads (``ops.connect``)."""
    settings = get_settings()
    client = backend.get_client(settings.cache)
    return client, backend.namespace(settings.cache, settings.key_prefix)


def _receivers(recorder: Recorder) -> tuple[tuple[Any, Callable[..., None]], ...]:
    return (
        (signals.lock_acquired, recorder.acquired),
        (signals.lock_contended, recorder.contended),
        (signals.lock_lost, recorder.lost),
    )


def _installed() -> set[Recorder]:
    """The recorders an earlier ``install`` tapped."""
    found = (getattr(r, "__self__", None) for r in signals.tapped(signals.lock_acquired))
    return {recorder for recorder in found if isinstance(recorder, Recorder)}


def install() -> Recorder:
    """Record this process's signals (from ``AppConfig.ready``).

    ``ready()`` may run more than once (a test overriding
    ``INSTALLED_APPS``): a recorder installed before is stopped and untapped
    first, so every acquire is recorded once.
    """
    olds = _installed()
    recorder = Recorder(_connect)
    # first: what the counters hand over from now on is the new recorder's,
    # never a stopped one's
    counters.TALLY.on_unwaited = recorder.add_unwaited
    counters.TALLY.on_first_unwaited = recorder.wake
    for old in olds:
        for signal, receiver in _receivers(old):
            signals.untap(signal, receiver)
        old.stop()
        old.forget_exit()
    for signal, receiver in _receivers(recorder):
        # directly (see signals._TAPS); an unwaited acquire comes from the counters
        signals.tap(signal, receiver, counted=signal is signals.lock_acquired)
    return recorder


@dataclass
class NameHistory:
    """One name over the minutes read: totals, and per-minute series."""

    name: str
    totals: Counter[str] = field(default_factory=Counter)
    acquired: list[int] = field(default_factory=list)
    p50_ms: list[float | None] = field(default_factory=list)
    p95_ms: list[float | None] = field(default_factory=list)


def read(client: Any, prefix: str, now: float, minutes: int = 60) -> list[dict[str, Counter[str]]]:
    """Each of the last ``minutes`` minutes (oldest first): name -> counters."""
    last = int(now // 60)
    pipe = client.pipeline(transaction=False)
    for minute in range(last - minutes + 1, last + 1):
        pipe.hgetall(minute_key(prefix, minute))
    found = []
    for reply in pipe.execute():
        names: dict[str, Counter[str]] = {}
        for raw, n in reply.items():
            text = backend.as_text(raw)
            name, _, counter = text.rpartition(SEP)
            try:
                names.setdefault(name, Counter())[counter] += int(n)
            except ValueError:  # written by hand: not a count
                continue
        found.append(names)
    return found


def percentile(histogram: Counter[str], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding the ``q`` quantile of waits."""
    counts = [histogram.get(f"w{i}", 0) for i in range(len(WAIT_BUCKETS_MS) + 1)]
    total = sum(counts)
    if not total:
        return None
    rank, seen = math.ceil(q * total), 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return float(WAIT_BUCKETS_MS[min(i, len(WAIT_BUCKETS_MS) - 1)])
    return None  # pragma: no cover - the loop always reaches the rank


def hot_names(
    history: Sequence[dict[str, Counter[str]]], *, window: int, order: str, top: int = 10
) -> list[NameHistory]:
    """The ``top`` names by ``order`` over the last ``window`` minutes of ``history``,
    each with its series over the whole history (for the charts)."""
    totals: dict[str, Counter[str]] = {}
    for minute in history[-window:]:
        for name, counts in minute.items():
            totals.setdefault(name, Counter()).update(counts)
    ranked = sorted(
        (name for name, c in totals.items() if c[order] > 0),
        key=lambda name: (-totals[name][order], name),
    )[:top]
    found = []
    for name in ranked:
        entry = NameHistory(name, Counter({c: totals[name][c] for c in COUNTERS}))
        for minute in history:
            counters = minute.get(name, Counter())
            entry.acquired.append(counters["acquired"])
            entry.p50_ms.append(percentile(counters, 0.5))
            entry.p95_ms.append(percentile(counters, 0.95))
        found.append(entry)
    return found
