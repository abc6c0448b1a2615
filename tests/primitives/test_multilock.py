from __future__ import annotations

import threading
import time

import pytest
import redis

from django_redislock import Lock, LockBackendError, LockNotOwnedError, LockTimeout, MultiLock
from tests.support.other_holders import OtherThread, refused_elsewhere
from tests.support.procs import processes


def test_names_are_deduplicated_and_sorted() -> None:
    multi = MultiLock(["b", "a", "b", "c"])
    assert multi.names == ("a", "b", "c")


@pytest.mark.parametrize(
    ("names", "error", "match"),
    [
        ("sku:1", TypeError, "single str"),
        (42, TypeError, "iterable of str"),
        ([], ValueError, "at least one"),
        (["a", ""], ValueError, r"names\[1\] must not be empty"),
        (["a", 3], TypeError, r"names\[1\] must be a str"),
        (["a\n"], ValueError, "control characters"),
    ],
)
def test_bad_names_are_refused(names: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        MultiLock(names)  # type: ignore[arg-type]


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        MultiLock(["a"], timeout=0)
    with pytest.raises(ValueError, match="blocking_timeout"):
        MultiLock(["a"], blocking_timeout=-1)


@pytest.mark.parametrize(
    ("blocking_timeout", "error", "match"),
    [(-1, ValueError, "non-negative"), ("5", TypeError, "number of seconds"),
     (float("nan"), ValueError, "finite")],
)  # fmt: skip
def test_bad_per_call_options_are_refused_before_anything_is_taken(
    blocking_timeout: object, error: type[Exception], match: str
) -> None:
    """As ``Lock.acquire`` refuses them: a bad ``blocking_timeout`` given with
    ``blocking=False`` was silently taken as "try once" (found by a review)."""
    multi = MultiLock(["a", "b"])
    for blocking in (False, True, None):
        with pytest.raises(error, match=match):
            multi.acquire(blocking=blocking, blocking_timeout=blocking_timeout)  # type: ignore[arg-type]
        assert not Lock("a").locked()
    with pytest.raises(TypeError, match="True or False"):
        multi.acquire(blocking="no")  # type: ignore[arg-type]


def test_acquire_takes_all_and_release_frees_all() -> None:
    multi = MultiLock(["b", "a"])
    with multi:
        assert multi.owned()
        assert Lock("a").locked() and Lock("b").locked()
        assert set(multi.fencing_tokens) == {"a", "b"}
    assert not Lock("a").locked()
    assert not Lock("b").locked()
    assert multi.fencing_tokens == {}


def test_all_or_nothing_when_one_part_is_taken(other_thread: OtherThread) -> None:
    other = Lock("b", timeout=20)
    other_thread(other.acquire)
    multi = MultiLock(["a", "b", "c"], blocking_timeout=0.1)
    assert multi.acquire() is False
    assert not Lock("a").locked(), "a part taken before the refusal was left held"
    assert not Lock("c").locked()
    assert multi.locked()
    with pytest.raises(LockTimeout) as info, multi:
        pass
    assert info.value.name == "b"
    assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
    other_thread(other.release)
    assert multi.acquire(blocking=False)
    multi.release()


def test_blocking_timeout_is_one_budget_for_the_whole_set() -> None:
    multi = MultiLock(["a", "b", "c"], blocking_timeout=1.0)
    held = threading.Event()
    done = threading.Event()

    def hold_then_free_one_by_one() -> None:
        holders = [Lock(name, timeout=20) for name in ("a", "b", "c")]
        for holder in holders:
            holder.acquire()
        held.set()
        for holder in holders:
            done.wait(0.7)  # the scenario: each part is freed 0.7 s after the last
            holder.release()

    thread = threading.Thread(target=hold_then_free_one_by_one)
    thread.start()
    try:
        held.wait(10)
        # each part alone comes within 1 s, the whole set does not
        assert multi.acquire() is False
    finally:
        thread.join()
    assert not any(Lock(n).locked() for n in ("a", "b", "c"))


def test_error_mid_way_releases_parts_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    multi = MultiLock(["a", "b"])
    second = multi.locks[1]

    def broken(*args: object) -> None:
        raise LockBackendError("Redis is unreachable", name="b")

    monkeypatch.setattr(second, "_acquire", broken)
    with pytest.raises(LockBackendError):
        multi.acquire()
    assert not Lock("a").locked()


def test_a_part_whose_lease_ran_out_while_the_rest_was_awaited_is_never_handed_over(
    other_thread: OtherThread,
) -> None:
    """Without renewal, a lease shorter than the wait for a later part: "a"
    ran out while "b" was awaited, and ``acquire()`` still answered True
    while another thread could take "a" (found by a review). A part known
    lapsed is renewed if still ours, else the set is taken again."""
    other = Lock("b", timeout=1.0, auto_renew=False)
    assert other_thread(other.acquire)  # never released: its lease frees "b"
    multi = MultiLock(["a", "b"], timeout=0.3, auto_renew=False, blocking_timeout=10)
    assert multi.acquire()
    assert all(part._handles.taken(part).lease_deadline > time.monotonic() for part in multi.locks)
    assert refused_elsewhere("a", other=other_thread)
    assert refused_elsewhere("b", other=other_thread)
    multi.release()  # nothing lost: no LockLostError


def _lapse_a_while_b_is_awaited(
    multi: MultiLock, monkeypatch: pytest.MonkeyPatch, *, gone: bool
) -> None:
    """While "b" is taken, "a"'s lease ends by the holder's clock (as after a
    wait longer than it); ``gone``: in Redis too."""
    first, second = multi.locks
    take = second._acquire

    def lapse_then_take(*args: object) -> object:
        first._handles.taken(first).lease_deadline = time.monotonic() - 0.001
        if gone:
            Lock("a")._resolve().client.delete("redislock:{a}:lock")
        return take(*args)

    monkeypatch.setattr(second, "_acquire", lapse_then_take)


def test_a_lapsed_part_still_held_is_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    multi = MultiLock(["a", "b"], timeout=30, auto_renew=False)
    _lapse_a_while_b_is_awaited(multi, monkeypatch, gone=False)
    assert multi.acquire()
    first = multi.locks[0]._handles.taken(multi.locks[0])
    assert first.depth == 1 and first.lease_deadline > time.monotonic() + 20
    assert refused_elsewhere("a")
    multi.release()


def test_a_lapsed_part_gone_when_the_budget_is_spent_refuses_the_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    multi = MultiLock(["a", "b"], timeout=30, auto_renew=False, blocking=False)
    _lapse_a_while_b_is_awaited(multi, monkeypatch, gone=True)
    with pytest.raises(LockTimeout) as info, multi:
        pass
    assert info.value.name == "a"
    assert not Lock("a").locked() and not Lock("b").locked()


def test_release_by_non_holder_raises() -> None:
    with pytest.raises(LockNotOwnedError):
        MultiLock(["a", "b"]).release()


def test_release_frees_every_part_even_if_one_was_lost(redis_client: redis.Redis) -> None:
    multi = MultiLock(["a", "b"], auto_renew=False)
    multi.acquire()
    redis_client.delete("redislock:{b}:lock")
    with pytest.raises(Exception, match="was lost"):
        multi.release()
    assert not Lock("a").locked()


def _cycle(order: list[str], rounds: int, counter_key: str) -> None:
    from django_redislock.backend.client import get_client

    client = get_client("default")
    for _ in range(rounds):
        with MultiLock(order, blocking_timeout=30):
            # a read-modify-write that loses updates unless exclusive
            value = int(client.get(counter_key) or 0)
            client.set(counter_key, value + 1)


@pytest.mark.slow
def test_opposite_orders_in_two_processes_never_deadlock(
    redis_client: redis.Redis, real_redis: None
) -> None:
    with processes(_cycle, [(["a", "b"], 500, "count"), (["b", "a"], 500, "count")]):
        pass
    assert int(redis_client.get("count") or 0) == 1000


def test_per_call_options_and_waiting_without_a_deadline(other_thread: OtherThread) -> None:
    from django.test import override_settings

    other = Lock("b", timeout=20)
    other_thread(other.acquire)
    multi = MultiLock(["a", "b"])
    assert multi.acquire(blocking=False) is False
    assert multi.acquire(blocking_timeout=0.05) is False
    other_thread(other.release)
    with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": None}):
        assert multi.acquire()  # waits for ever if need be: no deadline
    multi.extend(60)
    ttls = [lock.ttl() for lock in multi.locks]
    assert all(t is not None and 30 < t <= 60 for t in ttls)
    multi.release()


def test_with_block_reports_a_lost_part(redis_client: redis.Redis) -> None:
    from django_redislock import LockLostError

    with pytest.raises(LockLostError), MultiLock(["a", "b"], auto_renew=False):
        redis_client.delete("redislock:{a}:lock")
    assert not Lock("b").locked()


def test_reentrant_per_holder_like_lock() -> None:
    multi = MultiLock(["a", "b"])
    with multi:
        with multi:
            assert multi.owned()
        assert Lock("a").locked() and Lock("b").locked()
    assert not multi.locked()


def test_options_are_fixed_when_the_set_is_built() -> None:
    """The parts are built from the options: a later change would not reach them."""
    multi = MultiLock(["fixed:a", "fixed:b"], timeout=30)
    changes = {"timeout": 5, "auto_renew": False, "using": "other", "blocking": False,
               "blocking_timeout": 1, "names": ("x",)}  # fmt: skip
    for option, value in changes.items():
        with pytest.raises(AttributeError, match=rf"MultiLock\.{option} is fixed when"):
            setattr(multi, option, value)
    assert multi.timeout == 30 and all(part.timeout == 30 for part in multi.locks)


def test_a_release_after_a_failed_acquire_keeps_an_outer_hold(
    other_thread: OtherThread,
) -> None:
    """Inside ``with Lock("a")``, a MultiLock of a and b fails on b (held
    elsewhere) and gives back only its own level of a. A release in a
    ``finally`` must not free the outer hold: before, it did, and another
    thread could take a while the outer block still ran."""
    b = Lock("b")
    assert other_thread(b.acquire)
    multi = MultiLock(["a", "b"], blocking=False)
    with Lock("a"):
        assert not multi.acquire()
        with pytest.raises(LockNotOwnedError):
            multi.release()
        with pytest.raises(LockNotOwnedError):
            multi.extend(30)
        assert not other_thread(Lock("a").acquire, blocking=False)
    other_thread(b.release)


def test_a_set_is_released_by_the_handle_that_took_it(other_thread: OtherThread) -> None:
    """Not by another MultiLock of the names: it cannot tell a set taken by
    a MultiLock from parts each held by an outer ``with Lock(name)``."""
    first = MultiLock(["a", "b"])
    assert first.acquire()
    with pytest.raises(LockNotOwnedError):
        MultiLock(["b", "a"]).release()
    assert refused_elsewhere("a") and refused_elsewhere("b")
    first.release()
    assert not Lock("a").locked() and not Lock("b").locked()


def test_a_release_after_a_failed_acquire_keeps_outer_holds_of_every_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    multi = MultiLock(["a", "b"])
    second = multi.locks[1]

    def broken(*args: object) -> object:
        raise LockBackendError("Redis went away", name="b")

    with Lock("a"), Lock("b"):
        monkeypatch.setattr(second, "_acquire", broken)
        with pytest.raises(LockBackendError):
            multi.acquire()
        with pytest.raises(LockNotOwnedError):
            multi.release()
        assert refused_elsewhere("a") and refused_elsewhere("b")
