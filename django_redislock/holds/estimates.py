"""When to come back: the ``Retry-After`` of a refused call, estimated from
the name's tallies (``holds/counters.py``) rather than the holder's whole lease.

``responses.py`` answers with these (423 for a lock, 429 for a slot); they
live beside the counters they read, so that the answers stay about HTTP.
"""

from __future__ import annotations

import math

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.exceptions import LockBackendError, LockTimeout
from django_redislock.holds import counters


def slot_retry_after(
    error: LockTimeout, *, timeout: float | None, using: str | None = None, limit: int = 1
) -> int:
    """Seconds until a caller refused a slot of ``error.name`` would likely get one.

    From what the slot's holders take: the key's ``@require_slot`` calls
    that ended held their slot ``held_ms / held`` on average (``Tally.held``),
    so one of the ``limit`` busy slots frees within about that, and each
    ``limit`` callers queued ahead add as much again. A 1 s view under a 30 s
    lease used to answer ``Retry-After: 30``. Capped by the semaphore's own
    hint (the earliest-ending permit's lease, read from the Redis server's
    clock in the refusing script); rounded up, at least 1. With no history
    (counters off, none ended yet, Redis failing) it is that hint, or the
    lease (``timeout``, else ``REDISLOCK['TIMEOUT']``): long, never short,
    as a ``Retry-After`` should err when nothing is known.
    """
    settings = get_settings()
    seconds = error.retry_after
    if not seconds:
        seconds = timeout if timeout is not None else settings.timeout
    if error.name is not None and settings.stats:
        try:
            average, queued = _slot_history(error.name, using)
        except backend.backend_errors_and(LockBackendError):  # the 429 stands without it
            average, queued = None, 0
        if average is not None:
            seconds = min(seconds, average * (queued // limit + 1))
    return max(1, math.ceil(seconds))


def _slot_history(name: str, using: str | None) -> tuple[float | None, int]:
    """The average hold in seconds of the key's ended ``@require_slot`` calls
    (``None`` when none is counted) and its queue's length: one round trip
    (this process's counts not written yet added from its tally)."""
    settings = get_settings()
    alias = using or settings.cache
    client, prefix = backend.get_client(alias), backend.namespace(alias, settings.key_prefix)
    stats_key = backend.key(prefix, name, "stats")
    pipe = client.pipeline(transaction=False)
    pipe.hmget(stats_key, ["held", "held_ms"])
    pipe.zcard(backend.key(prefix, name, "sem:queue"))
    (held, held_ms), queued = pipe.execute()
    own_held, own_held_ms = counters.pending_held(client, stats_key.encode())
    held, held_ms = int(held or 0) + own_held, int(held_ms or 0) + own_held_ms
    return (held_ms / held / 1000.0 if held else None), int(queued)


def retry_after(error: LockTimeout, *, timeout: float | None, using: str | None) -> int:
    """Seconds until a caller refused ``error.name`` would likely get it.

    From the name's counters (``REDISLOCK['STATS']``): past acquirers that
    waited in line and got the lock waited ``wait_ms / waited`` on average,
    about one hold each; this caller would wait for the current hold and for
    each waiter queued now, so the estimate is that average times (queued +
    1). Refused calls are left out of the average: they add to
    ``contended`` but not to ``wait_ms``, so dividing by ``contended`` made
    the estimate shrink with every 423, the busier the name the sooner.
    It is capped by the holder's remaining lease (or the lock's lease when
    that is unknown), and is at least 1. With no history (counters off, or
    the first contention of the name) it is the holder's remaining lease.
    """
    settings = get_settings()
    cap = error.retry_after or (timeout if timeout is not None else settings.timeout)
    name = error.name
    if name is not None and settings.stats:
        try:
            average, queued = _history(name, using)
        except backend.backend_errors_and(LockBackendError):  # the 423 stands without it
            average, queued = None, 0
        if average is not None:
            estimate = average * (queued + 1)
            cap = min(estimate, cap) if cap else estimate
    return max(1, math.ceil(cap)) if cap else 1


def _history(name: str, using: str | None) -> tuple[float | None, int]:
    """The average wait in seconds of an acquire that waited and got the
    lock (``None`` when never waited for) and the number of waiters queued
    now: one round trip.

    ``wait_ms`` and ``waited`` are written batched (``holds/counters.py``): this
    process's own waits not written yet are added from its tally, other
    processes' may be up to a second behind. A counters hash written before
    ``waited`` was counted has only ``contended`` to divide by.
    """
    settings = get_settings()
    alias = using or settings.cache
    client, prefix = backend.get_client(alias), backend.namespace(alias, settings.key_prefix)
    stats_key = backend.key(prefix, name, "stats")
    pipe = client.pipeline(transaction=False)
    pipe.hmget(stats_key, ["waited", "wait_ms", "contended"])
    pipe.zcard(backend.key(prefix, name, "queue"))
    (waited, wait_ms, contended), queued = pipe.execute()
    _, own_wait_ms, own_waited = counters.pending(client, stats_key.encode())
    wait_ms = int(wait_ms or 0) + own_wait_ms
    waits = int(waited or 0) + own_waited or int(contended or 0)
    if not waits or not wait_ms:
        return None, int(queued)
    return wait_ms / waits / 1000.0, int(queued)
