"""The operation kinds of a worker, one function each, keyed by ``OpPlan.kind``.

Every kind guards the register rows named after its lock names (``schedule.CAPACITY``)
and goes through ``Op.hold`` / ``Op.ahold``, which log what the checker reads.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from tests.faults.nemesis.schedule import SOCKET_TIMEOUT
from tests.faults.nemesis.workers import Op

#: The naive lock's fixed lease in sabotage mode: shorter than some sections.
NAIVE_LEASE = 0.25


def _options(op: Op) -> dict[str, object]:
    plan = op.plan
    return {
        "timeout": plan.lease,
        "blocking_timeout": plan.blocking_timeout,
        "auto_renew": plan.auto_renew,
    }


def lock(op: Op) -> None:
    """``Lock``; ``lock_nested`` takes it again (another handle, same thread) and
    writes under the inner hold; ``lock_extend`` extends it with a new lease."""
    from django_redislock import Lock

    handle = Lock("lock", **_options(op))

    def body() -> None:
        token = handle.fencing_token
        op.log("token", res="lock", token=token)
        op.work(0)
        if op.plan.kind == "lock_nested":
            inner = Lock("lock", blocking_timeout=op.plan.blocking_timeout)
            nested = inner.acquire()
            op.log("nested", ok=nested, token=inner.fencing_token)
            try:
                op.rmw("lock", inner.fencing_token)
            finally:
                inner.release()
            return
        if op.plan.kind == "lock_extend":
            handle.extend(op.plan.new_lease)
            op.log("extended", lease=op.plan.new_lease)
        op.rmw("lock", token)

    op.begin(("lock",))
    op.hold(handle.acquire, body, handle.release)


def alock(op: Op) -> None:
    from django_redislock import AsyncLock

    handle = AsyncLock("lock", **_options(op))

    async def body() -> None:
        token = await handle.get_fencing_token()  # the property would block the loop
        op.log("token", res="lock", token=token)
        await _asleep(op.plan.work[0])
        await op.armw("lock", token)

    op.begin(("lock",))
    op.run_async(op.ahold(handle.acquire, body, handle.release))


def semaphore(op: Op) -> None:
    from django_redislock import Semaphore

    handle = Semaphore("sem", 2, **_options(op))

    def body() -> None:
        token = handle.fencing_token
        op.log("token", res="sem", token=token)
        op.work(0)
        op.rmw("sem", token)

    op.begin(("sem",))
    op.hold(handle.acquire, body, handle.release)


def asemaphore(op: Op) -> None:
    from django_redislock import AsyncSemaphore

    handle = AsyncSemaphore("sem", 2, **_options(op))

    async def body() -> None:
        token = await handle.get_fencing_token()  # the property would block the loop
        op.log("token", res="sem", token=token)
        await _asleep(op.plan.work[0])
        await op.armw("sem", token)

    op.begin(("sem",))
    op.run_async(op.ahold(handle.acquire, body, handle.release))


def rwlock(op: Op) -> None:
    """A reader only reads the register; a writer read-modify-writes it."""
    from django_redislock import ReadWriteLock

    both = ReadWriteLock("rw", **_options(op))
    reading = op.plan.kind == "rw_read"
    side = both.read() if reading else both.write()

    def body() -> None:
        token = side.fencing_token
        op.log("token", res="rw", token=token)
        op.work(0)
        if reading:
            op.peek("rw")
        else:
            op.rmw("rw", token)

    op.begin(("rw",), mode="r" if reading else "w")
    op.hold(side.acquire, body, side.release)


def multilock(op: Op) -> None:
    from django_redislock import MultiLock

    handle = MultiLock(op.plan.names, **_options(op))

    def body() -> None:
        tokens = handle.fencing_tokens
        for name in op.plan.names:
            op.log("token", res=name, token=tokens.get(name))
        op.work(0)
        for name in op.plan.names:
            op.rmw(name, tokens[name])

    op.begin(op.plan.names)
    op.hold(handle.acquire, body, handle.release)


def redlock(op: Op) -> None:
    from django_redislock import Redlock

    handle = Redlock("red", **_options(op))

    def body() -> None:
        token = handle.fencing_token  # one round trip: may find the hold lost
        op.log("token", res="red", token=token)
        op.work(0)
        op.rmw("red", token)

    op.begin(("red",))
    op.hold(handle.acquire, body, handle.release)


def naive(op: Op) -> None:
    """Sabotage: ``tests/support/naive.py``'s lock (fixed lease, unconditional
    ``DEL`` on release, no fencing) guarding a plain read-modify-write. The
    checker must catch it."""
    from tests.support.naive import NaiveLock

    client = _naive_client(op)
    handle = NaiveLock(client, "lock", lease=NAIVE_LEASE)

    def acquire() -> bool:
        try:
            return handle.acquire(op.plan.blocking_timeout)
        except redis.RedisError as exc:
            raise _backend(exc) from exc

    def release() -> None:
        try:
            handle.release()
        except redis.RedisError as exc:
            raise _backend(exc) from exc

    def body() -> None:
        op.work(0)
        op.rmw("lock", None)

    op.begin(("lock",))
    op.hold(acquire, body, release)


_clients: dict[str, redis.Redis] = {}


def _naive_client(op: Op) -> redis.Redis:
    url = op.worker.args.naive_url
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    return _clients[url]


def _backend(exc: Exception) -> Exception:
    from django_redislock import LockBackendError

    return LockBackendError(f"naive lock: {exc!r}", name="lock")


async def _asleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


OPERATIONS: dict[str, Callable[[Op], None]] = {
    "lock": lock,
    "lock_nested": lock,
    "lock_extend": lock,
    "alock": alock,
    "sem": semaphore,
    "asem": asemaphore,
    "rw_read": rwlock,
    "rw_write": rwlock,
    "multi": multilock,
    "redlock": redlock,
    "naive": naive,
}
