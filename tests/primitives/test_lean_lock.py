"""The lean Lock contract: an uncontended acquire is one plain ``SET NX PX``,
the fencing token is taken on first use (or up front, when asked), and the
one relaxation of fairness (a newcomer may go first after a lease ran out
with waiters queued) goes no further than documented in
``docs/guarantees.md``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import Lock, LockLostError
from django_redislock import signals as lock_signals
from django_redislock.backend.scripts import LOCK_ACQUIRE
from django_redislock.backend.values import parse_lock_value
from django_redislock.engine.steps import REFUSED, acquire_reply
from django_redislock.primitives import lock_common
from tests.primitives.test_handoff import key, owner, queue_fake_waiter
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture


def state_of(client: redis.Redis, name: str) -> Any:
    state = parse_lock_value(client.get(key(name, "lock")))
    assert state is not None
    return state


def test_an_uncontended_acquire_writes_the_holder_with_its_set(redis_client: redis.Redis) -> None:
    with Lock("lean-value", timeout=20) as lock:
        state = state_of(redis_client, "lean-value")
        assert (state.count, state.waiters, state.fencing_token) == (1, False, 0)
        assert state.lease == 20.0 and state.holder.split(":")[2] == "MainThread"
        assert 0 < redis_client.pttl(key("lean-value", "lock")) <= 20_000
        assert lock.owned()
    assert not redis_client.exists(key("lean-value", "lock"))


def test_a_set_sent_again_after_its_reply_was_lost_counts_as_held(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's retry sends the SET again when its first reply was lost:
    the second finds the caller's own value and fails; the acquire script
    that follows finds it the caller's, and grants it (no queue entry)."""
    real = lock_common.LOCK_TAKE

    class ReplyLost:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            assert real(client, keys, args)  # the first SET took it...
            return real(client, keys, args)  # ...the retry's reply: not set

    monkeypatch.setattr(lock_common, "LOCK_TAKE", ReplyLost())
    lock = Lock("lean-retried", blocking_timeout=5)
    assert lock.acquire()
    monkeypatch.undo()
    assert lock.owned()
    assert redis_client.zcard(key("lean-retried", "queue")) == 0
    lock.release()
    assert not lock.locked()


def test_the_fencing_token_is_taken_on_first_use_and_kept(redis_client: redis.Redis) -> None:
    with Lock("lean-fence", fencing=True) as first:
        eager = first.fencing_token
    with Lock("lean-fence") as lock:
        assert state_of(redis_client, "lean-fence").fencing_token == 0  # none taken yet
        token = lock.fencing_token
        assert token is not None and eager is not None and token > eager
        assert state_of(redis_client, "lean-fence").fencing_token == token
        assert lock.fencing_token == token  # the same token again
        with Lock("lean-fence") as inner:  # nested: the same hold, the same token
            assert inner.fencing_token == token
    with Lock("lean-fence", fencing=True) as later:
        assert later.fencing_token is not None and later.fencing_token > token
    assert Lock("lean-fence").fencing_token is None  # not held


def test_a_nested_handle_that_asks_up_front_gets_the_token_at_its_acquire(
    redis_client: redis.Redis,
) -> None:
    with Lock("lean-nest") as outer:
        with Lock("lean-nest", fencing=True):
            token = state_of(redis_client, "lean-nest").fencing_token
            assert token > 0
        assert outer.fencing_token == token


def test_a_lost_hold_gets_no_fencing_token(redis_client: redis.Redis) -> None:
    lock = Lock("lean-lost", auto_renew=False)
    with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError):
        with lock:
            redis_client.delete(key("lean-lost", "lock"))
            with pytest.raises(LockLostError, match="fencing token"):
                _ = lock.fencing_token
            with pytest.raises(LockLostError):  # found lost: no round trip, still refused
                _ = lock.fencing_token
    assert [call["name"] for call in lost] == ["lean-lost"]


def test_a_lock_asking_for_its_token_up_front_takes_it_in_its_acquire(
    redis_client: redis.Redis,
) -> None:
    with Lock("lean-eager", fencing=True):
        assert state_of(redis_client, "lean-eager").fencing_token > 0


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_fencing_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match="fencing must be True or False"):
        Lock("x", fencing=value)  # type: ignore[arg-type]


def test_fencing_is_a_fixed_option() -> None:
    lock = Lock("x", fencing=True)
    assert lock.fencing is True and Lock("x").fencing is False
    with pytest.raises(AttributeError, match="fixed"):
        lock.fencing = False  # type: ignore[misc]


def test_the_acquire_script_grants_a_lock_freed_since_the_set(redis_client: redis.Redis) -> None:
    """The SET NX found it taken, and the holder released before the script ran."""
    keys = LOCK_ACQUIRE.keys_of({"lock": key("lean-freed", "lock")})
    token = "ab" * 16
    args = LOCK_ACQUIRE.args_of(
        token=token, lease_ms=5000, mode="try", fenced=0, holder="h:1:T", since_ms=0,
        waiter_ttl_ms=3000, stats_ttl_ms=0,
    )  # fmt: skip
    assert LOCK_ACQUIRE(redis_client, keys, args) == -1  # held, no fencing token yet
    assert owner(redis_client, "lean-freed") == token
    redis_client.delete(key("lean-freed", "lock"))


# the one relaxation, and how far it goes ------------------------------------------


def test_no_newcomer_goes_first_while_holders_release_normally(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    holder = Lock("lean-fair", timeout=30)
    holder.acquire()
    waiter = "cd" * 16
    queue_fake_waiter(redis_client, "lean-fair", waiter, grant_ms=30_000)
    assert not other_thread(lambda: Lock("lean-fair").acquire(blocking=False))  # held
    holder.release()
    assert owner(redis_client, "lean-fair") == waiter  # handed over: never free
    # the newcomer's SET NX fails, and so does its script: the waiter holds it
    assert not other_thread(lambda: Lock("lean-fair").acquire(blocking=False))


def recheck(client: redis.Redis, name: str, token: str) -> int:
    """What a queued waiter of ``token`` sends when its wait ends: the acquire
    script, ``wait`` mode (``Lock``'s re-check); its status."""
    keys = LOCK_ACQUIRE.keys_of({"lock": key(name, "lock")})
    args = LOCK_ACQUIRE.args_of(
        token=token, lease_ms=30_000, mode="wait", fenced=0, holder="ghost:1:MainThread",
        since_ms=0, waiter_ttl_ms=60_000, stats_ttl_ms=0, waited_ms=1,
    )  # fmt: skip
    return acquire_reply(LOCK_ACQUIRE(client, keys, args))[0]


def test_a_newcomer_may_go_first_only_after_a_lease_ran_out_then_the_queue_is_served(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    """The holder stalls past its lease with a waiter queued: until that
    waiter re-checks (when the lease would have ended), a newcomer's SET NX
    takes the free lock. The re-check queues the waiter again, first in
    line, and the newcomer's release hands the lock to it, not to the next
    newcomer."""
    stalled = Lock("lean-lapse", timeout=0.3, auto_renew=False)
    stalled.acquire()
    waiter = "ef" * 16
    queue_fake_waiter(redis_client, "lean-lapse", waiter, grant_ms=30_000)
    deadline = time.monotonic() + 10
    while redis_client.exists(key("lean-lapse", "lock")):  # the lease runs out
        assert time.monotonic() < deadline
        time.sleep(0.02)
    newcomer = Lock("lean-lapse")
    assert other_thread(lambda: newcomer.acquire(blocking=False))  # the relaxation: it went first
    assert recheck(redis_client, "lean-lapse", waiter) == REFUSED  # held, queued again
    assert state_of(redis_client, "lean-lapse").waiters  # and the newcomer's value says so
    assert redis_client.zrange(key("lean-lapse", "queue"), 0, 0) == [waiter.encode()]
    other_thread(newcomer.release)
    assert owner(redis_client, "lean-lapse") == waiter  # the queue is served next
    assert not other_thread(lambda: Lock("lean-lapse").acquire(blocking=False))
    with pytest.raises(LockLostError):
        stalled.release()


def test_a_real_waiter_is_served_after_a_newcomer_that_went_first(
    redis_client: redis.Redis,
) -> None:
    """With a waiter that re-checks, the same: it queues again behind the
    newcomer and gets the lock at the newcomer's release."""
    stalled = Lock("lean-lapse-2", timeout=0.5, auto_renew=False)
    stalled.acquire()
    got: list[str] = []
    queued = threading.Event()

    def wait() -> None:
        lock = Lock("lean-lapse-2", blocking_timeout=20)
        queued.set()
        with lock:
            got.append("waiter")

    thread = threading.Thread(target=wait)
    thread.start()
    assert queued.wait(10)
    deadline = time.monotonic() + 10
    while not redis_client.zcard(key("lean-lapse-2", "queue")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    newcomer = Lock("lean-lapse-2", blocking_timeout=20)
    assert newcomer.acquire()  # the stalled lease runs out: newcomer or waiter first
    got.append("newcomer")
    newcomer.release()
    thread.join(20)
    assert sorted(got) == ["newcomer", "waiter"]
    assert not redis_client.exists(key("lean-lapse-2", "queue"))
