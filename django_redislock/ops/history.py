"""Per-minute contention history for the dashboard's "hot names" panel: read
and ranked here.

The per-name counters (``backend/scripts/_stats.lua``) are totals since the name was
last idle; they cannot say *when*. The history keeps, per minute, how often
each name was acquired, waited for, timed out and lost, the time waited and a
histogram of waits: counted by each process in the one tally of lock use and
written by its thread (``holds/counters.py``, which says what that trades), into
one hash per minute, ``<prefix>:{~hot}:minute:<unix minute>``, with fields
``<name>\\x1f<counter>``. Every minute of every name is in one hash, which
sits in one hash slot on Redis Cluster. Recording is on with
``REDISLOCK["STATS"]`` and off with it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.holds.counters import COUNTERS as COUNTERS
from django_redislock.holds.counters import FIELDS as FIELDS
from django_redislock.holds.counters import KEEP_SECONDS as KEEP_SECONDS
from django_redislock.holds.counters import SEP as SEP
from django_redislock.holds.counters import WAIT_BUCKETS_MS as WAIT_BUCKETS_MS
from django_redislock.holds.counters import bucket as bucket
from django_redislock.holds.counters import minute_key as minute_key


@dataclass
class NameHistory:
    """One name over the minutes read: totals, and per-minute series."""

    name: str
    totals: Counter[str] = field(default_factory=Counter)
    acquired: list[int] = field(default_factory=list)
    p50_ms: list[float | None] = field(default_factory=list)
    p95_ms: list[float | None] = field(default_factory=list)
    #: The wait histogram over the whole history (the hour the charts show).
    waits: Counter[str] = field(default_factory=Counter)


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
            entry.waits.update({k: n for k, n in counters.items() if k.startswith("w") and n})
            entry.acquired.append(counters["acquired"])
            entry.p50_ms.append(percentile(counters, 0.5))
            entry.p95_ms.append(percentile(counters, 0.95))
        found.append(entry)
    return found
