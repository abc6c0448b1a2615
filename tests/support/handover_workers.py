"""Worker processes of the hand-over tests (``Lock.detach`` / ``Lock.adopt``).

Spawned by ``tests.support.procs``; each reports through Redis lists of the
suite's server (``RPUSH``, read by the test with ``BLPOP``), so the test
waits on events, never on sleeps.
"""

from __future__ import annotations

import json
import os
import time

import redis


def _report() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"])


def detach_and_exit(name: str, lease: float, out: str) -> None:
    """A view: takes ``name``, reads its fencing token, hands the hold off
    and ends (the hold outlives the process); reports the ticket."""
    from django_redislock import Lock

    with Lock(name, timeout=lease) as lock:
        fence = lock.fencing_token
        ticket = lock.detach()
    _report().rpush(out, json.dumps({"ticket": ticket, "fence": fence, "pid": os.getpid()}))


def detach_and_stay(name: str, lease: float, out: str, stop: str) -> None:
    """A view whose process lives on after the detach (its watchdog thread
    too, renewing another hold): reports the ticket, then waits for ``stop``."""
    from django_redislock import Lock

    client = _report()
    other = Lock(f"{name}:other", timeout=lease)
    other.acquire()  # keeps this process's watchdog busy for the whole test
    lock = Lock(name, timeout=lease)
    lock.acquire()
    client.rpush(out, json.dumps({"ticket": lock.detach(), "pid": os.getpid()}))
    assert client.blpop([stop], timeout=60), "the test never said stop"
    assert other.owned(), "the watchdog stopped renewing the hold it still has"
    other.release()


def adopt_and_hold(out: str, inbox: str, lease: float, leases: float) -> None:
    """A worker: takes the ticket from ``inbox``, adopts the hold, makes
    ``lease`` its lease and keeps it for ``leases`` times that (renewed by
    its own watchdog), extends it, reports its fencing token and who Redis
    says holds it, and releases."""
    from django_redislock import Lock, LockLostError
    from django_redislock.backend.values import parse_lock_value

    client = _report()
    item = client.blpop([inbox], timeout=60)
    assert item is not None, "no ticket came"
    ticket = json.loads(item[1])["ticket"]
    lock = Lock.adopt(ticket)
    report: dict[str, object] = {"pid": os.getpid(), "fence": lock.fencing_token}
    lock.extend(lease)  # short: only this process's watchdog keeps it past it
    time.sleep(leases * lease)  # the subject: held past its lease, by this watchdog alone
    report["owned"] = lock.owned()
    state = parse_lock_value(client.get(f"redislock:{{{lock.name}}}:lock"))
    report["holder"] = None if state is None else state.holder
    report["detached"] = None if state is None else state.detached_since
    lock.extend(lease * 2)
    report["ttl"] = lock.ttl()
    try:
        Lock.adopt(ticket)
    except LockLostError as exc:
        report["again"] = str(exc)
    lock.release()
    report["released"] = not lock.locked()
    client.rpush(out, json.dumps(report))
