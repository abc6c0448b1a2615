"""A hold handed to another thread or process: ``detach()`` and ``Lock.adopt(ticket)``.

The hand-overs between processes run in real OS processes (spawned) against
the suite's redis-server; they report through Redis lists, read with BLPOP.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockLostError, LockNotOwnedError, require_lock
from django_redislock import signals as lock_signals
from django_redislock.backend.values import parse_lock_value
from django_redislock.holds import tickets
from django_redislock.holds.watchdog import watchdog
from tests.support import handover_workers as workers
from tests.support.other_holders import OtherThread, refused_elsewhere
from tests.support.procs import reap, start_one
from tests.support.signals_helper import capture

KEY = "redislock:{{{}}}:lock"


def state_of(client: redis.Redis, name: str) -> Any:
    return parse_lock_value(client.get(KEY.format(name)))


def gone(client: redis.Redis, name: str, timeout: float) -> bool:
    """Whether ``name``'s key goes within ``timeout`` (polled: a lease running
    out sends no event)."""
    deadline = time.monotonic() + timeout
    while client.exists(KEY.format(name)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def edited(ticket: str, **changes: Any) -> str:
    """``ticket`` with fields changed, keeping its old signature."""
    payload, signature = ticket.split(":", 1)  # signature: the timestamp's and the HMAC
    data = json.loads(signing.b64_decode(payload.encode()))
    data.update(changes)
    forged = signing.b64_encode(json.dumps(data, separators=(",", ":")).encode()).decode()
    return f"{forged}:{signature}"


# --- detach -----------------------------------------------------------------------------


def test_leaving_the_block_after_detach_releases_nothing(redis_client: redis.Redis) -> None:
    with Lock("export", timeout=5) as lock:
        ticket = lock.detach()
        assert not lock.owned()
        assert lock.fencing_token is None
    assert lock.locked()  # still held: by the ticket
    assert refused_elsewhere("export")
    state = state_of(redis_client, "export")
    assert state.detached_since is not None and state.count == 1
    assert abs(state.detached_since - time.time()) < 5  # the server's clock, at the detach
    assert "MainThread" in state.holder and "\x1e" not in state.holder
    assert 4.0 < redis_client.pttl(KEY.format("export")) / 1000 <= 5.0  # a whole lease
    with Lock.adopt(ticket) as adopted:
        assert adopted.owned()
    assert not redis_client.exists(KEY.format("export"))


def test_the_ticket_is_signed_ascii_json_with_what_an_adopter_needs() -> None:
    lock = Lock("report:7", timeout=4)
    lock.acquire()
    fence = lock.fencing_token
    ticket = lock.detach()
    assert ticket.isascii() and "\n" not in ticket
    data = signing.loads(ticket, salt=tickets.SALT)
    assert data["name"] == "report:7" and data["kind"] == "lock"
    assert data["using"] == "default" and data["prefix"] == "redislock"
    assert data["fence"] == fence and data["lease_ms"] == 4000
    assert len(data["token"]) == 32  # the detached hold's, unguessable
    Lock.adopt(ticket).release()


def test_a_nested_hold_cannot_be_detached() -> None:
    with Lock("n") as outer:
        with Lock("n") as inner:
            with pytest.raises(RuntimeError, match="2 levels deep"):
                inner.detach()
            assert inner.owned()
        assert outer.owned()
    assert not outer.locked()


def test_detach_of_a_lock_not_held_is_not_owned() -> None:
    with pytest.raises(LockNotOwnedError):
        Lock("free").detach()


def test_detach_of_a_cleared_hold_is_lost(redis_client: redis.Redis) -> None:
    lock = Lock("cleared")
    lock.acquire()
    redis_client.delete(KEY.format("cleared"))
    with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError, match="detached"):
        lock.detach()
    assert len(lost) == 1
    with pytest.raises(LockLostError):  # as any lost hold's handle is told at its release
        lock.release()


def test_detach_stops_the_watchdog_and_says_released() -> None:
    lock = Lock("w", timeout=3)
    lock.acquire()
    assert watchdog.watching() >= 1
    before = watchdog.watching()
    with capture(lock_signals.lock_released) as released:
        ticket = lock.detach()
    assert watchdog.watching() == before - 1
    assert [r["name"] for r in released] == ["w"]
    with capture(lock_signals.lock_acquired) as acquired:
        adopted = Lock.adopt(ticket)
    assert [a["name"] for a in acquired] == ["w"]
    adopted.release()


def test_the_detaching_thread_may_take_the_name_again_once_adopted(
    other_thread: OtherThread,
) -> None:
    lock = Lock("again", blocking_timeout=10)
    with lock:
        ticket = lock.detach()
        assert not lock.acquire(blocking=False)  # the ticket's hold, not this thread's
        other_thread(lambda: Lock.adopt(ticket).release())
        with lock:  # free again
            assert lock.owned()
        assert not lock.owned()
    assert not lock.locked()


def test_a_handle_reused_for_many_detaches_keeps_nothing_of_them() -> None:
    lock = Lock("reused")
    for _ in range(5):
        lock.acquire()
        Lock.adopt(lock.detach()).release()
    assert len(lock._handles.entered(lock)) == 1  # the last one's, until the next acquire
    with lock:
        assert lock._handles.entered(lock) == [lock._holding()]
    assert not lock.locked()


@require_lock("job:<pk>", timeout=5)
def start_job(pk: int) -> str:
    """A guarded function that hands its own hold on (to a task, say)."""
    return Lock(f"job:{pk}").detach()


def test_a_hold_require_lock_took_can_be_detached() -> None:
    ticket = start_job(1)
    assert Lock("job:1").locked()  # the guard released nothing
    Lock.adopt(ticket).release()


@pytest.mark.django_db(transaction=True)
def test_a_detached_hold_is_not_handed_to_the_transaction() -> None:
    with transaction.atomic():
        ticket = start_job(2)
    assert Lock("job:2").locked()  # the commit released nothing either
    Lock.adopt(ticket).release()


# --- adopt --------------------------------------------------------------------------------


def test_a_ticket_is_adopted_once(other_thread: OtherThread) -> None:
    lock = Lock("once")
    lock.acquire()
    ticket = lock.detach()
    adopted = other_thread(Lock.adopt, ticket)
    with pytest.raises(LockLostError, match="adopted already") as refused:
        Lock.adopt(ticket)
    assert refused.value.name == "once"
    other_thread(adopted.release)
    with pytest.raises(LockLostError, match="lease ran out"):
        Lock.adopt(ticket)


@pytest.mark.parametrize(
    "change",
    [
        {"name": "someone-else"},
        {"lease_ms": 3_600_000},
        {"fence": 1},
        {"token": "0" * 32},
    ],
    ids=lambda c: next(iter(c)),
)
def test_an_edited_ticket_is_refused_before_redis(change: dict[str, Any]) -> None:
    lock = Lock("signed")
    lock.acquire()
    ticket = lock.detach()
    with pytest.raises(LockLostError, match="forged or edited"):
        Lock.adopt(edited(ticket, **change))
    Lock.adopt(ticket).release()  # the genuine one still works


@pytest.mark.parametrize("forged", ["", "nonsense", "e30:abc", "a:b:c"])
def test_a_forged_ticket_is_lost_not_a_crash(forged: str) -> None:
    with pytest.raises(LockLostError, match="forged or edited"):
        Lock.adopt(forged)


def test_a_ticket_signed_with_another_secret_key_is_refused() -> None:
    with override_settings(SECRET_KEY="another site's key, long enough for Django's checks"):
        lock = Lock("elsewhere")
        lock.acquire()
        ticket = lock.detach()
    with pytest.raises(LockLostError, match="forged or edited"):
        Lock.adopt(ticket)


def test_a_ticket_that_is_no_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ticket must be a str"):
        Lock.adopt(b"bytes")  # type: ignore[arg-type]


def test_a_ticket_whose_lease_ran_out_is_lost(redis_client: redis.Redis) -> None:
    lock = Lock("short", timeout=0.3)
    lock.acquire()
    ticket = lock.detach()
    assert gone(redis_client, "short", timeout=10)
    with pytest.raises(LockLostError, match="lease ran out"):
        Lock.adopt(ticket)


def test_a_ticket_for_keys_under_another_prefix_is_improperly_configured() -> None:
    lock = Lock("p")
    lock.acquire()
    ticket = lock.detach()
    with override_settings(REDISLOCK={"KEY_PREFIX": "other"}):
        with pytest.raises(ImproperlyConfigured, match="KEY_PREFIX"):
            Lock.adopt(ticket)
    Lock.adopt(ticket).release()


def test_the_fencing_token_goes_with_the_hold(redis_client: redis.Redis) -> None:
    lock = Lock("fenced")
    lock.acquire()
    fence = lock.fencing_token
    adopted = Lock.adopt(lock.detach())
    assert adopted.fencing_token == fence
    adopted.release()
    unfenced = Lock("unfenced")  # no token taken before the detach: the adopter takes one
    unfenced.acquire()
    adopted = Lock.adopt(unfenced.detach())
    assert state_of(redis_client, "unfenced").fencing_token == 0
    assert adopted.fencing_token
    assert state_of(redis_client, "unfenced").fencing_token == adopted.fencing_token
    adopted.release()


def test_adopt_extend_detach_again_hands_the_hold_on_per_request() -> None:
    """The shape of a lease held across requests: each request adopts the
    last ticket, extends, and detaches again for the next."""
    lock = Lock("edit:42", timeout=2)
    lock.acquire()
    fence = lock.fencing_token
    ticket = lock.detach()
    for _ in range(3):
        request = Lock.adopt(ticket)
        request.extend(5)
        previous, ticket = ticket, request.detach()
        assert previous != ticket
        with pytest.raises(LockLostError, match="adopted already"):
            Lock.adopt(previous)
    last = Lock.adopt(ticket)
    assert last.timeout == 5 and last.fencing_token == fence
    assert 4 < (last.ttl() or 0) <= 5
    last.release()
    assert not last.locked()


def test_the_adopter_nests_and_leaves_the_hold_held_until_its_last_release() -> None:
    lock = Lock("nest")
    lock.acquire()
    with Lock.adopt(lock.detach()) as adopted:
        with Lock("nest", blocking_timeout=0) as inner:  # the adopter's thread holds it now
            assert inner.owned()
        assert adopted.owned()
    assert not adopted.locked()


def test_without_auto_renew_the_adopted_hold_is_not_renewed(redis_client: redis.Redis) -> None:
    lock = Lock("quiet", timeout=0.5)
    lock.acquire()
    adopted = Lock.adopt(lock.detach(), auto_renew=False)
    assert adopted.auto_renew is False
    assert gone(redis_client, "quiet", timeout=10)
    with pytest.raises(LockLostError):
        adopted.release()


# --- AsyncLock ----------------------------------------------------------------------------


def test_async_detach_and_adopt_also_across_sync_and_async() -> None:
    async def main() -> None:
        lock = AsyncLock("a", timeout=3)
        async with lock:
            fence = await lock.get_fencing_token()
            ticket = await lock.detach()
            assert not await lock.owned()
        assert await lock.locked()
        async with await AsyncLock.adopt(ticket) as adopted:
            assert await adopted.owned()
            assert await adopted.get_fencing_token() == fence
            ticket = await adopted.detach()
        assert await lock.locked()

        def adopt_in_a_thread() -> int | None:  # from a task to a thread
            again = Lock.adopt(ticket)
            try:
                return again.fencing_token
            finally:
                again.release()

        assert await asyncio.to_thread(adopt_in_a_thread) == fence
        assert not await lock.locked()
        with pytest.raises(LockLostError, match="lease ran out"):
            await AsyncLock.adopt(ticket)

    asyncio.run(main())


def test_an_async_nested_hold_cannot_be_detached() -> None:
    async def main() -> None:
        async with AsyncLock("an") as outer, AsyncLock("an") as inner:
            with pytest.raises(RuntimeError, match="levels deep"):
                await inner.detach()
            assert await outer.owned()

    asyncio.run(main())


# --- between processes --------------------------------------------------------------------


@pytest.mark.usefixtures("real_redis")
def test_a_view_process_hands_its_hold_to_a_worker_process(redis_client: redis.Redis) -> None:
    """The view detaches and ends; the worker adopts, holds past the lease
    on its own watchdog, has the same fencing token, extends and releases;
    the same ticket adopted again is refused."""
    started = [start_one(workers.adopt_and_hold, "t:worker", "t:inbox", 0.6, 4)]
    try:
        started.append(start_one(workers.detach_and_exit, "export:9", 30.0, "t:view"))
        item = redis_client.blpop(["t:view"], timeout=60)
        assert item is not None
        view = json.loads(item[1])
        started[1].join(60)
        assert started[1].exitcode == 0  # the view's process is gone; the hold is not
        assert state_of(redis_client, "export:9").detached_since is not None
        redis_client.rpush("t:inbox", item[1])
        item = redis_client.blpop(["t:worker"], timeout=60)
        assert item is not None
        started[0].join(60)
        assert started[0].exitcode == 0
    finally:
        reap(started)
    worker = json.loads(item[1])
    assert worker["pid"] != view["pid"]
    assert worker["fence"] == view["fence"]
    assert worker["owned"] is True  # four leases on, renewed by the worker
    assert f":{worker['pid']}:" in worker["holder"] and worker["detached"] is None
    assert 0.6 < worker["ttl"] <= 1.2  # extended to two leases
    assert "adopted already" in worker["again"]
    assert worker["released"] is True
    with pytest.raises(LockLostError, match="lease ran out"):
        Lock.adopt(view["ticket"])


@pytest.mark.usefixtures("real_redis")
def test_after_detach_the_process_renews_it_no_more(redis_client: redis.Redis) -> None:
    """Nobody adopts: the detaching process lives on, its watchdog renewing
    another hold, and the detached hold's lease runs out."""
    proc = start_one(workers.detach_and_stay, "orphan", 1.0, "t:orphan", "t:stop")
    try:
        item = redis_client.blpop(["t:orphan"], timeout=60)
        assert item is not None
        ticket = json.loads(item[1])["ticket"]
        assert gone(redis_client, "orphan", timeout=10)
        assert redis_client.exists(KEY.format("orphan:other"))  # renewed all along
        redis_client.rpush("t:stop", "1")
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        reap([proc])
    with pytest.raises(LockLostError, match="lease ran out"):
        Lock.adopt(ticket)
