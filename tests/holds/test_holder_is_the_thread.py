"""The holder is the thread (or task), not the ``Lock`` object (``holds/registry.py``).

The first three tests are the cases where correct code used to wait on its
own hold until ``blocking_timeout``, once a hold had been handed to an open
transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.db import transaction
from django.test import Client, override_settings

from django_redislock import Lock, LockLostError, LockNotOwnedError, Semaphore, require_lock
from django_redislock import signals as lock_signals
from tests.engine.test_waits import wait_for_queue
from tests.models import Item
from tests.support.other_holders import OtherThread, refused_elsewhere


@pytest.fixture
def _views() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.lock_views"):
        yield


@pytest.mark.django_db(transaction=True)
def test_a_decorated_function_called_twice_in_one_transaction(other_thread: OtherThread) -> None:
    runs: list[str] = []

    @require_lock("job:<job_id>", blocking_timeout=0.2)
    def run(job_id: int) -> None:
        runs.append(f"job:{job_id}")

    with transaction.atomic():
        run(7)
        run(7)  # used to wait on the first call's hold, then raise LockTimeout
        assert runs == ["job:7", "job:7"]
        assert refused_elsewhere("job:7")  # held until the commit
    assert not refused_elsewhere("job:7")
    assert not Lock("job:7").locked()


@pytest.mark.django_db
@pytest.mark.usefixtures("_views")
def test_two_requests_to_a_decorated_view_in_one_test(other_thread: OtherThread) -> None:
    client = Client()
    assert client.get("/buy/42/").status_code == 200
    assert client.get("/buy/42/").status_code == 200  # used to answer 423
    # held by the test's transaction (pytest-django's django_db) until it ends
    assert refused_elsewhere("sku:42")


@pytest.mark.django_db(transaction=True)
def test_deduct_inside_the_callers_own_hold_of_the_item(other_thread: OtherThread) -> None:
    item = Item.objects.create(stock=3)
    name = Item.inventory_lock_name(item.pk)
    started = time.monotonic()
    with transaction.atomic():
        with Lock(name, blocking_timeout=5):
            assert item.deduct(1) == 2  # used to wait on the caller's own lock
        assert time.monotonic() - started < 2
        assert refused_elsewhere(name)  # the deduction holds it to the commit
    assert not Lock(name).locked()
    assert Item.objects.get(pk=item.pk).stock == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_nested_holds_end_with_the_outer_transaction(ending: str) -> None:
    @require_lock("job:<job_id>", blocking_timeout=0.2)
    def run(job_id: int) -> None:
        pass

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback) if ending == "rollback" else _nothing():
        with transaction.atomic():
            run(1)
            with transaction.atomic():  # a savepoint
                run(1)
            assert Lock("job:1").locked()
            if ending == "rollback":
                raise Rollback
    assert not Lock("job:1").locked()


@pytest.mark.django_db(transaction=True)
def test_holds_end_when_the_connection_closes() -> None:
    from django.db import connection

    @require_lock("job:<job_id>")
    def run(job_id: int) -> None:
        pass

    transaction.set_autocommit(False)
    try:
        with transaction.atomic():
            run(3)
            run(3)
            connection.close()  # e.g. the worker's connection dropped mid-transaction
    except Exception:  # closing inside atomic makes its exit fail; the holds are what count
        pass
    finally:
        connection.connect()
    assert not Lock("job:3").locked()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def test_another_thread_releasing_gets_not_owned(other_thread: OtherThread) -> None:
    lock = Lock("mine")
    with lock:
        with pytest.raises(LockNotOwnedError):
            other_thread(Lock("mine").release)
        with pytest.raises(LockNotOwnedError):
            other_thread(lock.release)  # the same object: still not that thread's hold
        assert lock.owned()


def test_one_handle_used_by_two_threads_keeps_each_threads_holds_apart(
    other_thread: OtherThread,
) -> None:
    """A handle keeps what each thread entered through it apart
    (``ThreadHandle``): whichever thread used it first, each releases only
    its own, and a name one holds is refused to the other."""
    lock = Lock("handle-shared", blocking_timeout=0.2)
    assert other_thread(lock.acquire)  # the other thread uses it first
    assert not lock.acquire()  # this thread's turn: held by that one
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert not lock.owned() and other_thread(lock.owned)
    other_thread(lock.release)
    with lock:  # now this thread's, through the same handle
        assert lock.owned() and not other_thread(lock.owned)
        assert other_thread(lock.acquire, blocking=False) is False
    assert not lock.owned()


def test_threads_of_one_process_still_exclude_each_other(other_thread: OtherThread) -> None:
    with Lock("shared"):
        assert other_thread(Lock("shared").acquire, blocking=False) is False


def test_a_semaphore_counts_permits_per_acquire() -> None:
    """Documented: a permit per acquire, as ``threading.Semaphore`` does, so a
    thread that acquires twice holds two of the ``limit`` permits."""
    first, second = Semaphore("pool", 2), Semaphore("pool", 2)
    assert first.acquire() and second.acquire()
    assert not Semaphore("pool", 2).acquire(blocking=False)
    second.release()
    with pytest.raises(LockNotOwnedError):
        second.release()  # a permit belongs to the handle that took it
    first.release()


def test_a_hold_with_a_cache_alias_of_its_own_is_another_name(
    redis_client: redis.Redis, redis_url: str
) -> None:
    from tests.settings import redis_cache

    other_db = redis_url.rsplit("/", 1)[0] + "/4"
    caches = {"default": redis_cache(redis_url), "other": redis_cache(other_db)}
    with override_settings(CACHES=caches):
        with Lock("alias") as here, Lock("alias", using="other") as there:
            assert here.owned() and there.owned()
            assert here.fencing_token != there.fencing_token
        assert not here.locked() and not there.locked()


@pytest.mark.django_db(transaction=True)
def test_one_name_on_two_cache_aliases_is_two_holds_for_the_transaction(
    redis_url: str,
) -> None:
    """The transaction knew its holds by name only: the second alias's hold
    was released at once, while its writes were not committed (found by a
    review)."""
    from tests.settings import redis_cache

    other_db = redis_url.rsplit("/", 1)[0] + "/4"
    caches = {"default": redis_cache(redis_url), "b": redis_cache(other_db)}

    with override_settings(CACHES=caches):  # an alias is checked when the decorator is applied

        @require_lock("report:1", using="b")
        def on_b() -> None:
            pass

        @require_lock("report:1")
        def on_default() -> None:
            pass

        with transaction.atomic():
            on_b()
            on_default()
            assert refused_elsewhere("report:1")  # default's, held until the commit
        assert not Lock("report:1").locked()
        assert not Lock("report:1", using="b").locked()


class _OpenTransaction:
    """A database connection inside an atomic block, as ``transactions`` sees one."""

    def __init__(self) -> None:
        self.in_atomic_block = True

    def end(self) -> None:  # what atomic's outermost exit does
        self.in_atomic_block = False
        self.commit()

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_hold_handed_to_two_databases_transactions_ends_with_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ATOMIC_REQUESTS`` on two databases: the view runs inside both
    transactions, which commit one after the other. The hold went to the
    first one only, which commits first, so the lock was free while the
    writes to the other were not committed yet (found by a review)."""

    inner, outer = _OpenTransaction(), _OpenTransaction()

    class Connections:
        def all(self, initialized_only: bool = False) -> list[_OpenTransaction]:
            return [inner, outer]

    monkeypatch.setattr("django_redislock.transactions.connections", Connections())

    @require_lock("sku:<pk>")
    def view(pk: int) -> None:
        pass

    view(3)
    inner.end()
    assert refused_elsewhere("sku:3"), "freed before the other database committed"
    outer.end()
    assert not Lock("sku:3").locked()


def test_release_transaction_holds_of_one_database_releases_a_hold_shared_with_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a test with several databases each test transaction is open, so a
    hold goes to all of them; releasing it for one alias must release it."""
    from django_redislock import transactions

    first, second = _OpenTransaction(), _OpenTransaction()
    first.alias, second.alias = "default", "other"  # type: ignore[attr-defined]

    class Connections:
        def all(self, initialized_only: bool = False) -> list[_OpenTransaction]:
            return [first, second]

        def __getitem__(self, alias: str) -> _OpenTransaction:
            return {"default": first, "other": second}[alias]

    monkeypatch.setattr("django_redislock.transactions.connections", Connections())

    @require_lock("sku:<pk>")
    def view(pk: int) -> None:
        pass

    view(4)
    assert transactions.release_transaction_holds("default") == 1
    assert not Lock("sku:4").locked()
    assert transactions.release_transaction_holds() == 0
    second.end()  # its commit finds nothing left to release
    assert not Lock("sku:4").locked()


@pytest.mark.django_db(transaction=True)
def test_a_nested_decorated_call_keeps_the_name_until_the_commit(
    other_thread: OtherThread,
) -> None:
    """The caller's own ``with Lock`` ends before the commit: the decorated
    call's writes are still uncommitted, so its level stays with the transaction."""

    @require_lock("job:<job_id>")
    def run(job_id: int) -> None:
        pass

    with transaction.atomic():
        with Lock("job:5"):
            run(5)
        assert refused_elsewhere("job:5")
    assert not Lock("job:5").locked()


@pytest.mark.django_db
@pytest.mark.usefixtures("_views")
def test_release_transaction_holds_is_what_the_commit_would_do(
    other_thread: OtherThread,
) -> None:
    from django_redislock.transactions import release_transaction_holds

    assert Client().get("/buy/42/").status_code == 200
    assert refused_elsewhere("sku:42")  # the test's transaction never commits
    assert release_transaction_holds() == 1
    assert not Lock("sku:42").locked()
    assert release_transaction_holds() == 0


@pytest.mark.parametrize("waiting", [False, True])
def test_the_holders_last_release_frees_the_lock_whatever_redis_counted(
    redis_client: redis.Redis, waiting: bool
) -> None:
    """A nested acquire that timed out on the client may be counted by Redis
    later (tests/engine/test_hung_server.py): the holder's depth, not Redis's count, decides
    which release is the last, and that one frees the lock (or hands it on)."""
    key = "redislock:{counted-late}:lock"
    outer = Lock("counted-late", timeout=30)
    assert outer.acquire()
    with Lock("counted-late"):  # a nest and its release: back to depth 1, count 1
        pass
    token, rest = redis_client.get(key).decode().split(":", 1)
    waiters, count, tail = rest.split(":", 2)
    # what a late nest leaves: one level more in Redis than the holder has
    redis_client.set(key, f"{token}:{waiters}:{int(count) + 1}:{tail}", keepttl=True)
    with ThreadPoolExecutor(max_workers=1) as waiter:
        waiter_lock = Lock("counted-late", blocking_timeout=10)
        taken = waiter.submit(waiter_lock.acquire) if waiting else None
        if taken is not None:
            wait_for_queue(redis_client, "counted-late", 1)
        outer.release()
        if taken is not None:
            assert taken.result(10)  # handed on at once, not after the 30 s lease
            assert redis_client.get(key).decode().split(":", 1)[0] != token
            waiter.submit(waiter_lock.release).result(10)
    assert not redis_client.exists(key)


def test_an_inner_release_never_frees_the_lock_whatever_redis_counted(
    redis_client: redis.Redis,
) -> None:
    """A release Redis ran but whose reply was lost leaves Redis's count one
    below the holder's depth: the next inner release must keep the lock."""
    key = "redislock:{counted-twice}:lock"
    outer = Lock("counted-twice", timeout=30)
    assert outer.acquire()
    inner = Lock("counted-twice")
    assert inner.acquire()  # depth 2, count 2
    token, rest = redis_client.get(key).decode().split(":", 1)
    waiters, _, tail = rest.split(":", 2)
    # what a lost release reply leaves: one level less in Redis than the holder has
    redis_client.set(key, f"{token}:{waiters}:1:{tail}", keepttl=True)
    inner.release()  # not the last level: the lock stays this holder's
    assert redis_client.get(key).decode().startswith(token + ":")
    assert refused_elsewhere("counted-twice")
    outer.release()
    assert not redis_client.exists(key)


def test_a_failed_inner_release_still_leaves_its_level(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inner release whose reply was lost (Redis ran it): its ``with``
    block is left, so is its level. Before, the holder kept the level, the
    outer release went as an inner one, and the lock stayed held (renewed
    by the watchdog for as long as the thread lived)."""
    from django_redislock import LockBackendError
    from django_redislock.backend.scripts import LOCK_RELEASE, Script

    real = Script.__call__
    lost: list[bool] = []

    def reply_lost_once(script: Script, client: Any, keys: Any, args: Any) -> Any:
        result = real(script, client, keys, args)
        if script is LOCK_RELEASE and not lost:
            lost.append(True)
            raise redis.ConnectionError("connection reset after Redis ran it")
        return result

    monkeypatch.setattr("django_redislock.backend.scripts.Script.__call__", reply_lost_once)
    lock = Lock("inner-reply-lost", timeout=60)
    with pytest.raises(LockBackendError):
        with lock:
            with lock:
                pass
    assert lost
    assert not redis_client.exists("redislock:{inner-reply-lost}:lock")
    assert not lock.owned()


# @require_lock's writes have no guard of their own: a transaction whose hold is
# lost must not commit them (found by a review, reproduced on SQLite and PostgreSQL)


@pytest.mark.django_db(transaction=True)
def test_leaving_a_transaction_with_a_lost_lease_raises_and_rolls_back(
    redis_client: redis.Redis,
) -> None:
    item = Item.objects.create(stock=5, title="before")

    @require_lock("retitle:<pk>")
    def retitle(pk: int) -> None:
        redis_client.delete(f"redislock:{{retitle:{pk}}}:lock")  # an operator, a failover
        Item.objects.filter(pk=pk).update(title="written without the lock")

    with pytest.raises(LockLostError), transaction.atomic():
        retitle(item.pk)
    item.refresh_from_db()
    assert item.title == "before"
    assert not Lock(f"retitle:{item.pk}").locked()
    with pytest.raises(LockNotOwnedError):
        Lock(f"retitle:{item.pk}").release()  # nothing left in the thread


@pytest.mark.django_db(transaction=True)
def test_a_transaction_whose_hold_is_found_lost_before_its_commit_rolls_back(
    redis_client: redis.Redis,
) -> None:
    item = Item.objects.create(stock=5, title="before")

    @require_lock("retitle:<pk>", timeout=0.6)
    def retitle(pk: int) -> None:
        Item.objects.filter(pk=pk).update(title="committed after the loss")

    lost = threading.Event()

    def reported(sender: object, **kwargs: Any) -> None:
        lost.set()

    lock_signals.lock_lost.connect(reported, weak=False)
    try:
        with pytest.raises(LockLostError), transaction.atomic():
            retitle(item.pk)  # confirmed and handed to the transaction
            assert refused_elsewhere(f"retitle:{item.pk}")
            redis_client.delete(f"redislock:{{retitle:{item.pk}}}:lock")
            assert lost.wait(10), "the watchdog's next renewal never reported the loss"
    finally:
        lock_signals.lock_lost.disconnect(reported)
    item.refresh_from_db()
    assert item.title == "before"
    assert not Lock(f"retitle:{item.pk}").locked()


@pytest.mark.django_db(transaction=True)
def test_a_manual_transaction_keeps_the_hold_until_its_commit() -> None:
    item = Item.objects.create(stock=5)

    @require_lock("retitle:<pk>")
    def retitle(pk: int) -> None:
        Item.objects.filter(pk=pk).update(title="not committed yet")

    transaction.set_autocommit(False)
    try:
        retitle(item.pk)
        assert refused_elsewhere(f"retitle:{item.pk}"), "free before the commit"
        transaction.commit()
        assert not refused_elsewhere(f"retitle:{item.pk}")
    finally:
        transaction.set_autocommit(True)


@pytest.mark.django_db(transaction=True)
def test_a_call_that_raises_in_a_transaction_holds_until_the_transaction_ends() -> None:
    """Its writes may still commit (the caller catches the error and goes on):
    released at the return, the next holder would read the row before them
    and overwrite them."""
    item = Item.objects.create(stock=5)

    @require_lock("retitle:<pk>")
    def retitle(pk: int) -> None:
        Item.objects.filter(pk=pk).update(title="half done")
        raise RuntimeError("the second half failed")

    with transaction.atomic():
        with pytest.raises(RuntimeError):
            retitle(item.pk)
        assert refused_elsewhere(f"retitle:{item.pk}"), "free while the write is uncommitted"
    assert not refused_elsewhere(f"retitle:{item.pk}")
    with pytest.raises(RuntimeError), transaction.atomic():  # the usual case: rolled back
        retitle(item.pk)
    assert not refused_elsewhere(f"retitle:{item.pk}")
    with pytest.raises(RuntimeError):
        retitle(item.pk)  # no transaction: released at once
    assert not refused_elsewhere(f"retitle:{item.pk}")


@pytest.mark.django_db(transaction=True)
def test_on_commit_callbacks_run_after_the_release() -> None:
    """As docs/decorators.md says: work that needs the lock belongs in the
    function, not in an ``on_commit``."""
    seen: list[bool] = []

    @require_lock("notify:<pk>")
    def notify(pk: int) -> None:
        transaction.on_commit(lambda: seen.append(refused_elsewhere(f"notify:{pk}")))

    with transaction.atomic():
        notify(1)
        assert refused_elsewhere("notify:1")
    assert seen == [False]


def test_a_release_that_crashes_after_the_transaction_leaves_the_others_released(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_redislock import transactions

    holds = transactions.TransactionLocks(_OpenTransaction())  # type: ignore[arg-type]
    first, second = Lock("crash:1"), Lock("crash:2")
    first.acquire()
    second.acquire()
    holds.hold([first, second])
    real_end = transactions._Handed.end

    def end(self: Any, owner: Any, *, now: bool = False) -> bool:
        if self.lock is second:  # released first (reverse order): a bug of its own
            raise RuntimeError("boom")
        return real_end(self, owner, now=now)

    monkeypatch.setattr("django_redislock.transactions._Handed.end", end)
    assert holds.release_all() == 1
    assert not Lock("crash:1").locked(), "the hold after the crash was left to its lease"
    assert "Releasing 'crash:2' after the transaction ended" in caplog.text
    second.release()


@pytest.mark.django_db(transaction=True)
def test_a_decorated_call_on_a_name_its_transaction_already_holds_still_guards_the_commit(
    redis_client: redis.Redis,
) -> None:
    """``@require_lock`` on the item's own lock name, around a ``deduct()``:
    the deduction handed the name to the transaction first, unguarded (its
    ``UPDATE`` needs no lock). The call's hand-over found the name held and
    released its own level, so a loss found before the commit no longer
    stopped the call's unguarded writes from committing (found by a review)."""
    item = Item.objects.create(stock=5, title="before")
    name = Item.inventory_lock_name(item.pk)

    @require_lock("tests.item:<pk>", timeout=0.6)
    def sell(pk: int) -> None:
        Item.objects.get(pk=pk).deduct(1)
        Item.objects.filter(pk=pk).update(title="committed after the loss")

    lost = threading.Event()

    def reported(sender: object, **kwargs: Any) -> None:
        lost.set()

    lock_signals.lock_lost.connect(reported, weak=False)
    try:
        with pytest.raises(LockLostError), transaction.atomic():
            sell(item.pk)
            assert refused_elsewhere(name)
            redis_client.delete(f"redislock:{{{name}}}:lock")
            assert lost.wait(10), "the watchdog's next renewal never reported the loss"
    finally:
        lock_signals.lock_lost.disconnect(reported)
    item.refresh_from_db()
    assert (item.title, item.stock) == ("before", 5)
    assert not Lock(name).locked()


def test_a_name_one_databases_transaction_holds_is_still_handed_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ATOMIC_REQUESTS`` on two databases, and the view's name already held
    by one of their transactions (a ``deduct()`` there): the call released its
    own level, and the lock was free once that transaction committed, while
    the view's writes to the other database were not (found by a review)."""
    from django_redislock import transactions

    inner, outer = _OpenTransaction(), _OpenTransaction()

    class Connections:
        def all(self, initialized_only: bool = False) -> list[_OpenTransaction]:
            return [inner, outer]

    monkeypatch.setattr("django_redislock.transactions.connections", Connections())

    @require_lock("sku:<pk>")
    def view(pk: int) -> None:
        held = Lock(f"sku:{pk}")
        assert held.acquire()  # as a deduct() on the inner database does
        transactions.TransactionLocks.of(inner).hold([held])  # type: ignore[arg-type]

    view(3)
    inner.end()
    assert refused_elsewhere("sku:3"), "freed before the other database committed"
    outer.end()
    assert not Lock("sku:3").locked()


@pytest.mark.django_db(transaction=True)
def test_a_hand_over_never_opens_or_uses_a_database_connection(
    django_db_blocker: Any,
) -> None:
    """Deciding whether a connection is in a transaction read its autocommit
    through ``get_autocommit()``, which ensures a connection: with database
    access refused (pytest-django outside ``django_db``) every decorated call
    after a test that had left a connection open failed, and a function that
    never touches the database must not need one."""
    from django.db import connection

    @require_lock("job:<job_id>")
    def run(job_id: int) -> str:
        return "ran"

    connection.ensure_connection()
    with django_db_blocker.block():
        assert run(1) == "ran"
    assert not Lock("job:1").locked()
