"""The libraries under test, each reduced to ``acquire()`` / ``release()`` on one name.

Every peer gets the same 30 s lease as our ``Lock`` and its own plain redis-py
client to the same server; our ``Lock`` uses the django-redis connection the
settings point at, as a site would. Lock objects are built once per block, so a
cycle measures acquire + release only.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LEASE_SECONDS = 30

#: The compare-and-delete every correct Redis lock needs on release.
RAW_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

Pair = tuple[Callable[[], None], Callable[[], None]]


@dataclass(frozen=True)
class Library:
    key: str
    label: str
    make: Callable[[Any, str], Pair]
    #: Whether it takes part in the 8-process handoff runs.
    contended: bool = True


def _raw(client: Any, name: str) -> Pair:
    """The two-round-trip floor: ``SET NX PX`` and an ``EVALSHA`` compare-and-delete."""
    sha = client.script_load(RAW_RELEASE)
    lease_ms = LEASE_SECONDS * 1000
    state = {"token": ""}

    def acquire() -> None:
        token = secrets.token_hex(16)
        while not client.set(name, token, nx=True, px=lease_ms):
            time.sleep(0.001)
        state["token"] = token

    def release() -> None:
        client.evalsha(sha, 1, name, state["token"])

    return acquire, release


def _redislock(client: Any, name: str) -> Pair:
    from django_redislock import Lock

    lock = Lock(name)  # the defaults: 30 s lease, watchdog on, fair queue

    def acquire() -> None:
        while not lock.acquire():
            pass

    return acquire, lock.release


def _redispy(sleep: float) -> Callable[[Any, str], Pair]:
    def make(client: Any, name: str) -> Pair:
        lock = client.lock(name, timeout=LEASE_SECONDS, sleep=sleep)

        def acquire() -> None:
            lock.acquire(blocking=True)

        return acquire, lock.release

    return make


def _prl(auto_renewal: bool) -> Callable[[Any, str], Pair]:
    def make(client: Any, name: str) -> Pair:
        import redis_lock

        lock = redis_lock.Lock(client, name, expire=LEASE_SECONDS, auto_renewal=auto_renewal)

        def acquire() -> None:
            lock.acquire(blocking=True)

        return acquire, lock.release

    return make


def _pottery(client: Any, name: str) -> Pair:
    from pottery import Redlock

    lock = Redlock(key=name, masters={client}, auto_release_time=LEASE_SECONDS)

    def acquire() -> None:
        lock.acquire()

    return acquire, lock.release


LIBRARIES: dict[str, Library] = {
    lib.key: lib
    for lib in (
        Library("raw", "raw SET NX PX + EVALSHA", _raw, contended=False),
        Library("redislock", "django-redislock Lock", _redislock),
        Library("redispy", "redis-py Lock sleep=0.1", _redispy(0.1)),
        Library("redispy-fast", "redis-py Lock sleep=0.001", _redispy(0.001)),
        Library("prl", "python-redis-lock", _prl(False)),
        Library("prl-renew", "python-redis-lock auto_renewal", _prl(True)),
        Library("pottery", "pottery Redlock (1 master)", _pottery),
    )
}
