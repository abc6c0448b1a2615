"""Direct handoff: a release makes the first live waiter the owner at once.

The waiter wakes up holding the lock (no acquire round trip of its own), on a
short first lease that its watchdog renews; see ``backend/scripts/_handoff.lua``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from django_redislock import AsyncLock, Lock
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_CANCEL
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine.steps import REFUSED, acquire_reply, handoff_fresh
from django_redislock.holds import counters
from tests.engine.test_waits import wait_for_queue

KEY = "redislock:{{{}}}:{}"


def key(name: str, part: str) -> str:
    return KEY.format(name, part)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def queue_fake_waiter(client: redis.Redis, name: str, token: str, grant_ms: int) -> None:
    """A waiter that queued and then went silent (a process that died in line)."""
    now = server_ms(client)
    client.zadd(key(name, "queue"), {token: now * 1000})
    client.hset(key(name, "deadlines"), token, f"{now + 60_000}:{grant_ms}:ghost:1:MainThread")
    value = client.get(key(name, "lock"))
    assert value is not None and value.split(b":")[1] in (b"0", b"1")
    parts = value.split(b":")
    parts[1] = b"1"  # what the acquire script does when it queues someone
    client.set(key(name, "lock"), b":".join(parts), keepttl=True)


def owner(client: redis.Redis, name: str) -> str | None:
    state = parse_lock_value(client.get(key(name, "lock")))
    return None if state is None else state.token


def test_release_hands_the_lock_over_without_freeing_it(redis_client: redis.Redis) -> None:
    holder = Lock("hand", timeout=30)
    holder.acquire()
    first_fence = holder.fencing_token
    assert first_fence is not None
    acquired = threading.Event()
    fences: list[int | None] = []
    done = threading.Event()

    client_view: list[float] = []

    def wait() -> None:
        waiter = Lock("hand", timeout=30, blocking_timeout=30)
        with waiter:
            holding = waiter._holding()
            assert holding is not None
            client_view.append(holding.lease_deadline)
            fences.append(waiter.fencing_token)
            acquired.set()
            done.wait(30)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_queue(redis_client, "hand", 1)
    holder_token = owner(redis_client, "hand")
    holder.release()
    # The release script made the waiter the owner: the lock was never free,
    # and its first lease is the waiter's re-check span, not the full 30 s.
    assert owner(redis_client, "hand") not in (None, holder_token)
    assert 0 < redis_client.pttl(key("hand", "lock")) <= 3000
    assert redis_client.zcard(key("hand", "queue")) == 0
    assert acquired.wait(10)
    assert fences[0] is not None and fences[0] > first_fence
    # The waiter measures its first lease from before the handoff: never later than Redis.
    # (Deadlines compared, not time left: this thread may run late.)
    ttl = redis_client.pttl(key("hand", "lock")) / 1000
    assert client_view[0] <= time.monotonic() + ttl + 0.01
    # A short first lease, which the waiter's watchdog renews to the full 30 s.
    deadline = time.monotonic() + 10
    while redis_client.pttl(key("hand", "lock")) < 10_000:
        assert time.monotonic() < deadline, "the handed-over lease was never renewed"
        time.sleep(0.02)
    done.set()
    thread.join(10)
    assert not Lock("hand").locked()


def test_a_waiter_without_watchdog_takes_the_handoff_with_its_full_lease(
    redis_client: redis.Redis,
) -> None:
    holder = Lock("manual")
    holder.acquire()
    got = threading.Event()
    done = threading.Event()

    def wait() -> None:
        with Lock("manual", timeout=40, auto_renew=False, blocking_timeout=30):
            got.set()
            done.wait(30)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_queue(redis_client, "manual", 1)
    holder.release()
    assert got.wait(10)
    assert redis_client.pttl(key("manual", "lock")) > 30_000
    done.set()
    thread.join(10)


def test_a_waiter_that_died_in_line_blocks_the_lock_only_for_its_first_lease(
    redis_client: redis.Redis,
) -> None:
    holder = Lock("ghost")
    holder.acquire()
    queue_fake_waiter(redis_client, "ghost", "dead" * 8, grant_ms=400)
    holder.release()
    assert owner(redis_client, "ghost") == "dead" * 8  # handed over; nobody will renew it
    assert 0 < redis_client.pttl(key("ghost", "lock")) <= 400
    started = time.monotonic()
    newcomer = Lock("ghost", blocking_timeout=10)
    assert newcomer.acquire()
    assert time.monotonic() - started < 5  # the 400 ms lease, plus generous slack
    newcomer.release()


def acquire_args(token: str) -> list[object]:
    """A re-check of a waiter of ``token``, as ``Lock`` sends it after waiting 1 ms."""
    return LOCK_ACQUIRE.args_of(
        token=token,
        lease_ms=20_000,
        mode="wait",
        fenced=0,
        holder="h:1:T",
        since_ms=0,
        waiter_ttl_ms=3000,
        stats_ttl_ms=0,
        waited_ms=1,
    )


def test_a_waiter_giving_up_passes_on_a_handoff_it_had_not_taken(
    redis_client: redis.Redis,
) -> None:
    holder = Lock("quitter")
    holder.acquire()
    quitter = "feed" * 8
    queue_fake_waiter(redis_client, "quitter", quitter, grant_ms=30_000)
    acquired_at: list[float] = []

    def wait() -> None:
        with Lock("quitter", blocking_timeout=30):
            acquired_at.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_queue(redis_client, "quitter", 2)  # the quitter first, this thread second
    holder.release()
    assert owner(redis_client, "quitter") == quitter
    keys = LOCK_CANCEL.keys_of({p: key("quitter", p) for p in Lock.parts})
    cancelled = time.monotonic()
    assert LOCK_CANCEL(redis_client, keys, LOCK_CANCEL.args_of(token=quitter)) == 2
    thread.join(10)
    assert acquired_at, "the next waiter never got the lock"
    assert acquired_at[0] - cancelled < 5  # not the quitter's 30 s lease
    assert redis_client.exists(key("quitter", "signal:" + quitter)) == 0


def test_a_recheck_before_reading_the_signal_takes_the_handoff(
    redis_client: redis.Redis,
) -> None:
    holder = Lock("recheck")
    holder.acquire()
    token = "beef" * 8
    queue_fake_waiter(redis_client, "recheck", token, grant_ms=500)
    holder.release()
    assert redis_client.lrange(key("recheck", "signal:" + token), 0, -1) != []
    keys = LOCK_ACQUIRE.keys_of({p: key("recheck", p) for p in Lock.parts})
    args = acquire_args(token)
    fence = LOCK_ACQUIRE(redis_client, keys, args)
    assert fence > 0
    state = parse_lock_value(redis_client.get(key("recheck", "lock")))
    assert state is not None and state.token == token and state.fencing_token == fence
    assert redis_client.pttl(key("recheck", "lock")) > 10_000  # the full lease, not 500 ms
    assert redis_client.exists(key("recheck", "signal:" + token)) == 0
    assert redis_client.zcard(key("recheck", "queue")) == 0


def test_an_entry_without_a_first_lease_is_woken_instead(redis_client: redis.Redis) -> None:
    """A waiter queued by an older client: freed and woken, as before handoffs."""
    holder = Lock("legacy")
    holder.acquire()
    token = "cafe" * 8
    queue_fake_waiter(redis_client, "legacy", token, grant_ms=1)
    redis_client.hset(key("legacy", "deadlines"), token, server_ms(redis_client) + 60_000)
    holder.release()
    assert redis_client.exists(key("legacy", "lock")) == 0
    assert redis_client.lrange(key("legacy", "signal:" + token), 0, -1) == [b"1"]


def test_handoffs_are_counted_with_their_wait(redis_client: redis.Redis) -> None:
    holder = Lock("counted")
    holder.acquire()
    got = threading.Event()

    def wait() -> None:
        with Lock("counted", blocking_timeout=30):
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_queue(redis_client, "counted", 1)
    time.sleep(0.05)  # a measurable wait, not synchronisation
    holder.release()
    assert got.wait(10)
    thread.join(10)
    counters.flush()  # the client counts acquires, batched (holds/counters.py)
    stats = redis_client.hgetall(key("counted", "stats"))
    assert int(stats[b"acquired"]) == 2
    assert int(stats[b"contended"]) == 1
    assert int(stats[b"wait_ms"]) >= 40


def test_async_waiter_is_handed_the_lock(redis_client: redis.Redis) -> None:
    async def main() -> tuple[int | None, int | None, bool]:
        holder = AsyncLock("async-hand")
        await holder.acquire()
        first = holder.fencing_token

        checked = asyncio.Event()

        async def wait() -> int | None:
            waiter = AsyncLock("async-hand", blocking_timeout=30)
            async with waiter:
                await checked.wait()
                return waiter.fencing_token

        task = asyncio.create_task(wait())
        while redis_client.zcard(key("async-hand", "queue")) != 1:
            await asyncio.sleep(0.01)
        holder_token = owner(redis_client, "async-hand")
        await holder.release()
        never_free = owner(redis_client, "async-hand") not in (None, holder_token)
        checked.set()
        second = await asyncio.wait_for(task, 10)
        return first, second, never_free

    first, second, never_free = asyncio.run(main())
    assert never_free
    assert first is not None and second is not None and second > first


def test_a_handoff_whose_first_lease_ran_out_is_not_taken_later(
    redis_client: redis.Redis,
) -> None:
    """A waiter paused past its first lease, while someone else took the lock,
    must not wake up later believing the stale handoff."""
    holder = Lock("stale")
    holder.acquire()
    token = "face" * 8
    queue_fake_waiter(redis_client, "stale", token, grant_ms=50)
    holder.release()  # handed to the (paused) waiter, for 50 ms
    signal = key("stale", "signal:" + token)
    assert redis_client.llen(signal) == 1
    deadline = time.monotonic() + 10
    while redis_client.exists(key("stale", "lock")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    newcomer = Lock("stale")
    assert newcomer.acquire()  # the first lease ran out: the lock is free for anyone
    keys = LOCK_ACQUIRE.keys_of({p: key("stale", p) for p in Lock.parts})
    args = acquire_args(token)
    reply = LOCK_ACQUIRE(redis_client, keys, args)  # the waiter re-checks: refused, queued
    assert acquire_reply(reply)[0] == REFUSED
    assert redis_client.llen(signal) == 0  # and the stale handoff is gone
    newcomer.release()  # hands the lock to the re-queued waiter, with a fresh first lease
    assert owner(redis_client, "stale") == token


def test_a_handoff_read_late_is_checked_again() -> None:
    assert handoff_fresh(time.monotonic(), 3.0)
    assert not handoff_fresh(time.monotonic() - 2.5, 3.0)  # paused past most of it
    assert not handoff_fresh(time.monotonic(), 0.0)  # a waiter that takes no handoffs


def test_options_are_fixed_and_a_new_lock_gets_its_own(redis_client: redis.Redis) -> None:
    lock = Lock("retimed", timeout=30)
    with lock:
        assert redis_client.pttl(key("retimed", "lock")) > 20_000
    for option, value in [("timeout", 5), ("auto_renew", False), ("using", "other"),
                          ("blocking", False), ("blocking_timeout", 1), ("name", "x")]:  # fmt: skip
        with pytest.raises(AttributeError, match=rf"Lock\.{option} is fixed when the Lock is"):
            setattr(lock, option, value)
    assert lock.timeout == 30
    with Lock("retimed", timeout=5):  # shares nothing stale with the 30 s one
        assert redis_client.pttl(key("retimed", "lock")) <= 5000
    with lock:
        assert redis_client.pttl(key("retimed", "lock")) > 20_000
