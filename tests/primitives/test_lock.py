from __future__ import annotations

import gc
import logging
import math
import re
import threading
import time
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import Lock, LockBackendError, LockLostError, LockNotOwnedError, LockTimeout
from django_redislock import signals as lock_signals
from django_redislock.backend.values import parse_lock_value
from django_redislock.holds.watchdog import SCHEDULER_THREAD, watchdog
from tests.settings import redis_cache
from tests.support.clients import LIB
from tests.support.other_holders import OtherThread
from tests.support.renewals import hold_back_renewals
from tests.support.servers import free_port
from tests.support.signals_helper import capture


def test_acquire_release_and_key_goes_away(redis_client: redis.Redis) -> None:
    lock = Lock("sku:1")
    assert lock.acquire()
    assert lock.locked()
    assert lock.owned()
    assert redis_client.exists("redislock:{sku:1}:lock")
    lock.release()
    assert not lock.locked()
    assert not redis_client.exists("redislock:{sku:1}:lock")


def test_second_holder_is_refused_without_blocking(other_thread: OtherThread) -> None:
    first, second = Lock("x"), Lock("x")
    assert other_thread(first.acquire)
    assert second.acquire(blocking=False) is False
    assert not second.owned()
    other_thread(first.release)
    assert second.acquire(blocking=False)
    second.release()


def test_another_lock_object_in_the_holding_thread_reenters(redis_client: redis.Redis) -> None:
    first, second = Lock("x"), Lock("x", blocking_timeout=0)
    with first:
        with second:  # the holder is the thread: no wait on itself
            assert second.owned() and first.owned()
            assert second.fencing_token == first.fencing_token
            state = parse_lock_value(redis_client.get("redislock:{x}:lock"))
            assert state is not None and state.count == 2
        assert first.locked() and first.owned()
    assert not first.locked()


def test_the_last_release_of_the_thread_frees_it_through_any_object() -> None:
    first, second = Lock("x"), Lock("x")
    first.acquire()
    second.acquire()
    first.release()
    assert second.locked()
    second.release()
    assert not first.locked()
    with pytest.raises(LockNotOwnedError):
        first.release()


def test_context_manager_raises_lock_timeout_with_retry_after(other_thread: OtherThread) -> None:
    holder = Lock("x", timeout=20)
    other_thread(holder.acquire)
    with pytest.raises(LockTimeout) as info, Lock("x", blocking_timeout=0.05):
        pass
    assert info.value.name == "x"
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 20
    other_thread(holder.release)


def test_reentrant_nesting_keeps_key_until_last_release(redis_client: redis.Redis) -> None:
    lock = Lock("nest")
    with lock:
        token = lock.fencing_token
        with lock:
            assert lock.fencing_token == token
            state = parse_lock_value(redis_client.get("redislock:{nest}:lock"))
            assert state is not None
            assert state.count == 2
            assert state.fencing_token == token
        assert lock.locked()
    assert not lock.locked()


def test_same_object_in_another_thread_is_another_holder() -> None:
    lock = Lock("threads")
    lock.acquire()
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(lock.acquire(blocking=False)))
    thread.start()
    thread.join()
    assert seen == [False]
    lock.release()


def test_fencing_tokens_strictly_increase() -> None:
    tokens = []
    for _ in range(20):
        with Lock("fence") as lock:
            tokens.append(lock.fencing_token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_fencing_tokens_survive_data_loss(redis_client: redis.Redis) -> None:
    with Lock("fence") as lock:
        before = lock.fencing_token
    redis_client.flushall()  # what a restart without persistence does to the data
    with Lock("fence") as lock:
        assert lock.fencing_token is not None and before is not None
        assert lock.fencing_token > before


def test_release_by_non_holder_raises_not_owned(other_thread: OtherThread) -> None:
    holder, other = Lock("x"), Lock("x")
    other_thread(holder.acquire)
    with pytest.raises(LockNotOwnedError):
        other.release()
    with pytest.raises(LockNotOwnedError):
        other.extend()
    with pytest.raises(LockNotOwnedError):
        holder.release()  # the same object, but not the holding thread
    assert other_thread(holder.owned)
    other_thread(holder.release)


def test_extend_and_ttl() -> None:
    lock = Lock("ttl", timeout=5, auto_renew=False)
    assert lock.ttl() is None
    with lock:
        ttl = lock.ttl()
        assert ttl is not None and 0 < ttl <= 5
        lock.extend(60)
        ttl = lock.ttl()
        assert ttl is not None and 5 < ttl <= 60


def test_expired_lease_is_reported_on_release(redis_client: redis.Redis) -> None:
    lock = Lock("short", timeout=0.1, auto_renew=False)
    with capture(lock_signals.lock_lost) as lost, pytest.raises(LockLostError), lock:
        redis_client.delete("redislock:{short}:lock")  # an operator clears it
    assert [call["name"] for call in lost] == ["short"]


def test_lost_lease_does_not_mask_the_exception_in_flight(redis_client: redis.Redis) -> None:
    lock = Lock("mask", auto_renew=False)
    with pytest.raises(KeyError):
        with lock:
            redis_client.delete("redislock:{mask}:lock")
            raise KeyError("the real problem")


def test_another_holder_cannot_release_after_expiry(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    slow = Lock("expiry", timeout=0.2, auto_renew=False)
    other_thread(slow.acquire)
    redis_client.pexpire("redislock:{expiry}:lock", 1)
    fast = Lock("expiry")
    assert fast.acquire(blocking_timeout=5)
    with pytest.raises(LockLostError):
        other_thread(slow.release)  # must not delete fast's lock
    assert fast.owned()
    fast.release()


def test_a_lapsed_hold_is_not_carried_into_later_work(redis_client: redis.Redis) -> None:
    """A long-lived thread (a test runner's) whose hold ran out: the next
    acquire asks Redis, takes the name afresh, and reports the old hold lost."""
    leaked = Lock("lapsed", timeout=5, auto_renew=False)
    leaked.acquire()
    redis_client.delete("redislock:{lapsed}:lock")  # the lease ran out
    with capture(lock_signals.lock_lost) as lost, Lock("lapsed") as later:
        assert later.owned()
        state = parse_lock_value(redis_client.get("redislock:{lapsed}:lock"))
        assert state is not None and state.count == 1
    assert [call["name"] for call in lost] == ["lapsed"]
    assert not later.locked()
    with pytest.raises(LockLostError):
        leaked.release()  # its holder is told, and nothing of the later hold is touched
    with Lock("lapsed", blocking_timeout=0):  # nothing left over in the thread
        pass


def dropped_reports(caplog: pytest.LogCaptureFixture, *names: str) -> list[logging.LogRecord]:
    """The dropped-hold reports of ``names``: a hold an earlier test dropped
    can be reported while this one runs (the watchdog's scheduler logs the
    queue between passes), and must not count here."""
    return [
        r
        for r in caplog.records
        if "dropped without a release" in r.getMessage()
        and any(f" {name!r} held by " in r.getMessage() for name in names)
    ]


def test_a_dropped_hold_stops_renewal_and_is_forgotten(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    from django_redislock.holds.watchdog import watchdog

    caplog.set_level(logging.WARNING, logger="django_redislock")
    lock = Lock("dropped", timeout=30)  # no renewal due while the test runs
    lock.acquire()
    assert watchdog.watching() == 1
    del lock
    gc.collect()
    assert watchdog.watching() == 0  # renewal stopped: the lease runs out
    assert redis_client.pttl("redislock:{dropped}:lock") > 0
    with pytest.raises(LockNotOwnedError):
        Lock("dropped").release()  # no handle, no hold: the thread forgot it
    with Lock("dropped-next"):  # the next acquire reports it, in its own thread
        pass
    (record,) = dropped_reports(caplog, "dropped")
    assert record.levelno == logging.WARNING
    # the next acquire or the watchdog's scheduler, whichever comes first: never
    # the collector's thread (a dummy for a dying one)
    assert record.threadName in {threading.current_thread().name, SCHEDULER_THREAD}
    message = record.getMessage()
    assert "lock 'dropped' held by " in message
    # what is left of the 30 s lease: under 30 s, and not much under on a busy machine
    assert re.search(r"frees it within (2[0-9]|30)\.\d s", message), message


def test_a_thread_that_ends_holding_is_reported_by_the_watchdog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reported from the watchdog's side, not from the dying thread (where
    logging would make ``threading`` invent a dummy thread for it)."""
    import gc

    reported = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()  # not an earlier test's dropped hold
            if "dropped without a release" in message and " 'ended' held by " in message:
                reported.set()

    caplog.set_level(logging.WARNING, logger="django_redislock")
    seen = Seen()
    logging.getLogger("django_redislock").addHandler(seen)
    try:
        # keeps the scheduler passing (every 2 s); a lease long enough to
        # outlast gc.collect() in a process that has run the whole suite
        keeper = Lock("other-alive", timeout=6)
        keeper.acquire()
        worker = threading.Thread(target=lambda: Lock("ended", timeout=30).acquire() and None)
        worker.start()
        worker.join()
        gc.collect()
        assert reported.wait(15), "never reported"
        keeper.release()
    finally:
        logging.getLogger("django_redislock").removeHandler(seen)
    (record,) = dropped_reports(caplog, "ended")
    assert "lock 'ended'" in record.getMessage()
    assert not [t for t in threading.enumerate() if t.name.startswith("Dummy")]


def test_a_thread_that_ends_holding_through_a_handle_kept_elsewhere_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handle outlives the thread, which used it first: what the thread
    entered through it goes with the thread all the same (``ThreadHandle``)."""
    import gc

    from django_redislock.holds.watchdog import watchdog

    caplog.set_level(logging.WARNING, logger="django_redislock")
    kept = Lock("ended-kept", timeout=30)  # no renewal due while the test runs
    worker = threading.Thread(target=kept.acquire)
    worker.start()
    worker.join()
    gc.collect()
    assert watchdog.watching() == 0  # not renewed: nothing can release it now
    assert not kept.owned()
    with Lock("ended-kept-next"):  # the next acquire reports it, if the watchdog has not
        pass
    (record,) = dropped_reports(caplog, "ended-kept")
    assert "lock 'ended-kept' held by " in record.getMessage()
    kept.acquire(blocking=False)  # the handle is this thread's now: the lease still runs
    assert not kept.owned()


def test_a_thread_that_ends_holding_lets_go_even_if_an_exception_of_it_is_kept(
    redis_url: str,
) -> None:
    """The holds a thread entered through a handle go with the thread, not
    with anything else of the thread's: here its registry, kept alive by
    the traceback of an acquire that failed in it (a kept error, as a
    ``Future`` or an error log keeps one), which a handle that tied its
    first thread's holds to that registry let live on, renewed."""
    caches = {
        "default": redis_cache(redis_url),
        "down": redis_cache(f"redis://127.0.0.1:{free_port()}/0"),
    }
    kept = Lock("kept-handle", timeout=30)
    errors: list[BaseException] = []

    def work() -> None:
        assert kept.acquire()  # then the thread ends without releasing it
        try:
            Lock("elsewhere", using="down").acquire()  # a server that is down
        except LockBackendError as exc:
            errors.append(exc)  # kept by the caller, e.g. for a later report

    with override_settings(CACHES=caches):
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    gc.collect()
    assert len(errors) == 1
    # the thread is gone: nothing can release 'kept-handle' any more
    assert watchdog.watching() == 0, "a dead thread's hold is still renewed"
    assert not kept.owned()
    errors.clear()  # the traceback goes: only now is the hold let go
    gc.collect()
    assert watchdog.watching() == 0


def test_holds_released_lost_or_unrenewed_are_dropped_quietly(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a hold the watchdog still renewed is reported when dropped: not
    one released, nor one whose loss the watchdog already reported, nor one
    nothing renewed (``auto_renew=False``: its lease was the plan)."""
    import gc

    caplog.set_level(logging.WARNING, logger="django_redislock")
    with Lock("quiet-released"):
        pass
    lost = threading.Event()

    def on_lost(sender: object, **kwargs: Any) -> None:
        lost.set()

    lock_signals.lock_lost.connect(on_lost, weak=False)
    try:
        gone = Lock("quiet-lost", timeout=0.6)
        gone.acquire()
        redis_client.delete("redislock:{quiet-lost}:lock")
        assert lost.wait(10), "the watchdog never reported the loss"
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
    del gone
    planned = Lock("quiet-unrenewed", timeout=3600, auto_renew=False)
    assert planned.acquire(blocking=False)
    del planned
    gc.collect()
    with Lock("quiet-next"):  # where a report would be logged
        pass
    assert not dropped_reports(caplog, "quiet-released", "quiet-lost", "quiet-unrenewed")


def test_a_hold_dropped_after_a_renewal_is_not_kept_alive_by_the_watchdog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog's thread must not keep a reference to what it renewed while
    it sleeps: a dropped hold would be renewed forever, never running out."""
    import weakref

    _, renewed = hold_back_renewals(monkeypatch, "dropped-after-renewal")
    lock = Lock("dropped-after-renewal", timeout=0.3)
    lock.acquire()
    freed = threading.Event()
    ref = weakref.ref(lock._holding(), lambda _: freed.set())
    assert renewed.wait(5)  # the watchdog's thread has had the holding in hand
    del lock
    assert freed.wait(5), "the watchdog's thread keeps a dropped hold alive"
    assert ref() is None


def test_watchdog_keeps_lease_alive_past_timeout() -> None:
    lock = Lock("long", timeout=1.0, auto_renew=True)
    with lock:
        deadline = time.monotonic() + 3.0  # three leases
        while time.monotonic() < deadline:
            assert lock.owned()
            time.sleep(0.05)
        assert lock.owned()


def test_watchdog_tells_holder_when_lease_cleared(redis_client: redis.Redis) -> None:
    lock = Lock("cleared", timeout=0.3, auto_renew=True)
    event = threading.Event()

    def on_lost(**kwargs: object) -> None:
        if kwargs["name"] == "cleared":
            event.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLostError):
            with lock:
                redis_client.delete("redislock:{cleared}:lock")
                assert event.wait(5), "lock_lost was not sent by the watchdog"
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


def test_waiter_is_woken_by_release() -> None:
    holder = Lock("handoff", timeout=30)
    holder.acquire()
    got: list[float] = []
    ready = threading.Event()

    def wait() -> None:
        ready.set()
        lock = Lock("handoff", blocking_timeout=20)
        start = time.monotonic()
        assert lock.acquire()
        got.append(time.monotonic() - start)
        lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    ready.wait()
    time.sleep(0.3)  # let the waiter queue up and block (not synchronisation of the result)
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert got, "waiter never acquired"
    # woken by the release, not by the lease (30 s) or the fallback chunk (2 s)
    assert time.monotonic() - released < 1.5


def test_waiter_after_holder_lease_expires_without_release(redis_client: redis.Redis) -> None:
    dead = Lock("dead", timeout=0.5, auto_renew=False)
    dead.acquire()  # never released: the lease must free it
    start = time.monotonic()
    assert Lock("dead", blocking_timeout=10).acquire()
    assert time.monotonic() - start < 5


def test_contended_signal_when_giving_up(other_thread: OtherThread) -> None:
    holder = Lock("contended")
    other_thread(holder.acquire)
    with capture(lock_signals.lock_contended) as calls:
        assert not Lock("contended", blocking_timeout=0.1).acquire()
    assert len(calls) == 1
    assert calls[0]["kind"] == "lock"
    assert calls[0]["waited"] >= 0.09
    other_thread(holder.release)


def test_acquired_and_released_signals() -> None:
    with (
        capture(lock_signals.lock_acquired) as acquired,
        capture(lock_signals.lock_released) as released,
        Lock("sig", fencing=True) as lock,
    ):
        token = lock.fencing_token
    assert acquired[0]["name"] == "sig"
    assert acquired[0]["fencing_token"] == token
    assert released[0]["held"] >= 0


def test_an_acquire_that_took_no_fencing_token_announces_none() -> None:
    # Contract change (lean Lock): the fencing token is taken on first use,
    # after lock_acquired was sent, unless asked for up front (fencing=True).
    with capture(lock_signals.lock_acquired) as acquired, Lock("sig-lazy") as lock:
        assert lock.fencing_token is not None
    assert acquired[0]["fencing_token"] is None


def test_giving_up_leaves_no_queue_behind(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    holder = Lock("q")
    other_thread(holder.acquire)
    assert not Lock("q", blocking_timeout=0.05).acquire()
    assert redis_client.zcard("redislock:{q}:queue") == 0
    other_thread(holder.release)
    assert Lock("q").acquire(blocking=False)


def test_unreachable_redis_raises_backend_error() -> None:
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    caches = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=caches), pytest.raises(LockBackendError) as info:
        Lock("down").acquire()
    assert isinstance(info.value.__cause__, LIB.ConnectionError)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": 42}, TypeError),
        ({"name": "a\x00b"}, ValueError),
        ({"name": "x" * 2000}, ValueError),
        ({"name": "x", "timeout": 0}, ValueError),
        ({"name": "x", "timeout": -1}, ValueError),
        ({"name": "x", "timeout": math.nan}, ValueError),
        ({"name": "x", "timeout": math.inf}, ValueError),
        ({"name": "x", "timeout": "5"}, TypeError),
        ({"name": "x", "blocking_timeout": -0.5}, ValueError),
        ({"name": "x", "blocking_timeout": math.nan}, ValueError),
        ({"name": "x", "auto_renew": "yes"}, TypeError),
        ({"name": "x", "using": ""}, TypeError),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by every run of the test
    name = kwargs.pop("name")
    with pytest.raises(error) as info:
        Lock(name, **kwargs)  # type: ignore[arg-type]
    argument = next(iter(kwargs), "name")
    assert argument in str(info.value)


def test_names_with_braces_share_a_slot_and_do_not_collide(redis_client: redis.Redis) -> None:
    a, b = Lock("a{b}c"), Lock("a%7Bb%7Dc")
    assert a.acquire(blocking=False)
    assert b.acquire(blocking=False)  # a different name, a different key
    keys = sorted(k.decode() for k in redis_client.scan_iter("redislock:*:lock"))
    assert keys == ["redislock:{a%257Bb%257Dc}:lock", "redislock:{a%7Bb%7Dc}:lock"]
    a.release()
    b.release()


def test_key_prefix_setting(redis_client: redis.Redis) -> None:
    with override_settings(REDISLOCK={"KEY_PREFIX": "shop"}), Lock("p"):
        assert redis_client.exists("shop:{p}:lock")


def test_script_reloaded_after_script_flush(redis_client: redis.Redis) -> None:
    with Lock("noscript"):
        pass
    redis_client.script_flush()
    with Lock("noscript"):
        pass


def test_the_decoded_mode_hands_out_decoded_connections(responses: str) -> None:
    """The rig's own check: the decoded run really runs on decoded connections."""
    from django_redislock.backend import client as backend

    client = backend.get_client("default")
    assert client.get_encoder().decode_responses is (responses == "decoded")
    with Lock("mode") as lock:
        assert lock.owned()
        assert isinstance(
            client.get("redislock:{mode}:lock"), str if responses == "decoded" else bytes
        )


def test_a_task_that_ends_holding_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import gc

    from django_redislock import AsyncLock

    caplog.set_level(logging.WARNING, logger="django_redislock")

    async def job() -> None:
        await AsyncLock("task-ended", timeout=30).acquire()

    async def main() -> None:
        await asyncio.create_task(job())  # the task ends holding

    asyncio.run(main())
    gc.collect()
    with Lock("task-ended-next"):
        pass
    (record,) = dropped_reports(caplog, "task-ended")
    assert "lock 'task-ended'" in record.getMessage()
