"""The libraries under test, each reduced to ``acquire()`` / ``release()`` on one name.

Every peer gets the same 30 s lease as our ``Lock`` and its own plain redis-py
client to the same server; our ``Lock`` uses the django-redis connection the
settings point at, as a site would. Two shapes per library:

- ``make`` builds one lock object per block and returns its ``acquire`` /
  ``release`` (the *reused* mode, and the contended workers);
- ``per_use`` returns one cycle that builds a new lock object every time, the
  way a view calls it: ``with Lock(f"sku:{pk}", timeout=30, blocking_timeout=5):``
  and each peer's idiomatic equivalent.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LEASE_SECONDS = 30
#: How long a per-use cycle may wait (never reached: nobody else uses the name).
BLOCKING_TIMEOUT = 5

#: The compare-and-delete every correct Redis lock needs on release.
RAW_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

Pair = tuple[Callable[[], None], Callable[[], None]]
Cycle = Callable[[], None]


@dataclass(frozen=True)
class Library:
    key: str
    label: str
    make: Callable[[Any, str], Pair]
    #: One acquire+release cycle with a new lock object each time.
    per_use: Callable[[Any, str], Cycle]
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


def _raw_per_use(client: Any, name: str) -> Cycle:
    """The floor has no object: a cycle is the same two commands in either mode."""
    acquire, release = _raw(client, name)

    def cycle() -> None:
        acquire()
        release()

    return cycle


def _redislock(client: Any, name: str) -> Pair:
    from django_redislock import Lock

    lock = Lock(name)  # the defaults: 30 s lease, watchdog on, fair queue

    def acquire() -> None:
        while not lock.acquire():
            pass

    return acquire, lock.release


def _redislock_per_use(client: Any, name: str) -> Cycle:
    from django_redislock import Lock

    def cycle() -> None:
        with Lock(name, timeout=LEASE_SECONDS, blocking_timeout=BLOCKING_TIMEOUT):
            pass

    return cycle


def _redispy(sleep: float) -> Callable[[Any, str], Pair]:
    def make(client: Any, name: str) -> Pair:
        lock = client.lock(name, timeout=LEASE_SECONDS, sleep=sleep)

        def acquire() -> None:
            lock.acquire(blocking=True)

        return acquire, lock.release

    return make


def _redispy_per_use(sleep: float) -> Callable[[Any, str], Cycle]:
    def per_use(client: Any, name: str) -> Cycle:
        def cycle() -> None:
            with client.lock(
                name, timeout=LEASE_SECONDS, sleep=sleep, blocking_timeout=BLOCKING_TIMEOUT
            ):
                pass

        return cycle

    return per_use


def _prl(auto_renewal: bool) -> Callable[[Any, str], Pair]:
    def make(client: Any, name: str) -> Pair:
        import redis_lock

        lock = redis_lock.Lock(client, name, expire=LEASE_SECONDS, auto_renewal=auto_renewal)

        def acquire() -> None:
            lock.acquire(blocking=True)

        return acquire, lock.release

    return make


def _prl_per_use(auto_renewal: bool) -> Callable[[Any, str], Cycle]:
    def per_use(client: Any, name: str) -> Cycle:
        import redis_lock

        def cycle() -> None:
            with redis_lock.Lock(client, name, expire=LEASE_SECONDS, auto_renewal=auto_renewal):
                pass

        return cycle

    return per_use


def _pottery(client: Any, name: str) -> Pair:
    from pottery import Redlock

    lock = Redlock(key=name, masters={client}, auto_release_time=LEASE_SECONDS)

    def acquire() -> None:
        lock.acquire()

    return acquire, lock.release


def _pottery_per_use(client: Any, name: str) -> Cycle:
    from pottery import Redlock

    def cycle() -> None:
        with Redlock(key=name, masters={client}, auto_release_time=LEASE_SECONDS):
            pass

    return cycle


LIBRARIES: dict[str, Library] = {
    lib.key: lib
    for lib in (
        Library("raw", "raw SET NX PX + EVALSHA", _raw, _raw_per_use, contended=False),
        Library("redislock", "django-redislock Lock", _redislock, _redislock_per_use),
        Library("redispy", "redis-py Lock sleep=0.1", _redispy(0.1), _redispy_per_use(0.1)),
        Library(
            "redispy-fast",
            "redis-py Lock sleep=0.001",
            _redispy(0.001),
            _redispy_per_use(0.001),
        ),
        Library("prl", "python-redis-lock", _prl(False), _prl_per_use(False)),
        Library("prl-renew", "python-redis-lock auto_renewal", _prl(True), _prl_per_use(True)),
        Library("pottery", "pottery Redlock (1 master)", _pottery, _pottery_per_use),
    )
}
