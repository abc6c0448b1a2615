from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.db import transaction
from django.utils.connection import ConnectionDoesNotExist

from django_redislock import InsufficientStock, Lock, LockTimeout
from django_redislock.holds.watchdog import watchdog
from tests.models import Gadget, Item, Order, ProxyItem, SpecialItem
from tests.support.inventory_workers import buy_carts, buy_loop, buy_on_command, buy_via_view
from tests.support.other_holders import OtherThread, refused_elsewhere
from tests.support.procs import CTX, processes

pytestmark = pytest.mark.django_db(transaction=True)


def lock_of(item: Item) -> Lock:
    return Lock(Item.inventory_lock_name(item.pk))


def stock(item: Item) -> int:
    return Item.objects.values_list("stock", flat=True).get(pk=item.pk)


def test_deduct_returns_and_sets_what_is_left() -> None:
    item = Item.objects.create(stock=5)
    assert item.deduct() == 4
    assert item.deduct(3) == 1
    assert item.stock == 1
    assert stock(item) == 1
    assert not lock_of(item).locked()


def test_lock_name_is_per_model_and_item() -> None:
    item = Item.objects.create(stock=1)
    assert Item.inventory_lock_name(item.pk) == f"tests.item:{item.pk}"


def test_insufficient_stock_carries_available_and_changes_nothing() -> None:
    item = Item.objects.create(stock=2)
    with pytest.raises(InsufficientStock) as info:
        item.deduct(3)
    assert info.value.available == 2
    assert info.value.requested == 3
    assert info.value.item == item.pk
    assert stock(item) == 2
    assert item.stock == 2
    assert not lock_of(item).locked()


@pytest.mark.parametrize("quantity", [0, -1, 1.5, True, "1", None])
def test_bad_quantities_are_value_errors(quantity: Any) -> None:
    item = Item.objects.create(stock=5)
    with pytest.raises(ValueError, match="quantity must be a positive int"):
        item.deduct(quantity)
    with pytest.raises(ValueError, match="quantity must be a positive int"):
        item.restock(quantity)
    assert stock(item) == 5


def test_a_quantity_the_stock_field_cannot_hold_is_a_value_error() -> None:
    """Not an OverflowError (SQLite) or DataError (PostgreSQL) from inside the
    transaction: the field's range on this database, checked first."""
    item = Item.objects.create(stock=5)
    with pytest.raises(ValueError, match=r"quantity 10{20} is out of range for Item\.stock"):
        item.deduct(10**20)
    with pytest.raises(ValueError, match="out of range"):
        item.restock(10**20)
    with pytest.raises(ValueError, match=r"quantity of Item \d+ 10{20} is out of range"):
        Item.deduct_many({item: 10**20})
    assert stock(item) == 5


def test_cart_keys_that_only_look_like_a_primary_key_are_refused() -> None:
    """``IntegerField.to_python`` makes ``True`` and ``1.9`` into 1: a cart
    naming them must not deduct item 1."""
    item = Item.objects.create(stock=5)
    for key in (True, float(item.pk) + 0.9, Decimal(item.pk)):
        with pytest.raises(ValueError, match="nor its primary key"):
            Item.deduct_many({key: 1})
    assert stock(item) == 5


def test_a_cart_is_deducted_on_its_instances_database() -> None:
    """As ``deduct()`` routes an instance: the cart of an instance read from
    another database goes there, not to the router's default; instances of
    two databases are refused."""
    here, elsewhere = Item.objects.create(stock=5), Item.objects.create(stock=5)
    elsewhere._state.db = "other"  # as Item.objects.using("other") would have loaded it
    with pytest.raises(ValueError, match="databases 'default' and 'other'"):
        Item.deduct_many({here: 1, elsewhere: 1})
    with pytest.raises(ConnectionDoesNotExist, match="other"):  # routed there, not to default
        Item.deduct_many({elsewhere: 1})
    assert stock(here) == 5 and stock(elsewhere) == 5


def test_unsaved_item_is_refused() -> None:
    with pytest.raises(ValueError, match="must be saved"):
        Item(stock=3).deduct()


def test_missing_row_is_does_not_exist() -> None:
    item = Item.objects.create(stock=3)
    Item.objects.filter(pk=item.pk).delete()
    with pytest.raises(Item.DoesNotExist):
        item.deduct()
    with pytest.raises(Item.DoesNotExist):
        item.restock(1)


def test_restock() -> None:
    item = Item.objects.create(stock=0)
    assert item.restock(7) == 7
    assert stock(item) == 7


def test_custom_stock_field_and_lock_options(other_thread: OtherThread) -> None:
    gadget = Gadget.objects.create(on_hand=3)
    assert "stock" not in {f.name for f in Gadget._meta.get_fields()}
    assert gadget.deduct(2) == 1
    assert gadget.on_hand == 1
    holder = Lock(Gadget.inventory_lock_name(gadget.pk), timeout=20)
    other_thread(holder.acquire)
    try:
        with pytest.raises(LockTimeout):  # blocking_timeout 0.2 from the options
            gadget.deduct()
    finally:
        other_thread(holder.release)
    assert Gadget.objects.get(pk=gadget.pk).on_hand == 1


def test_the_write_is_guarded_even_without_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost lock (here: none at all) still cannot oversell."""
    monkeypatch.setattr(
        "django_redislock.transactions.hold_until_transaction_end", lambda *args: None
    )
    item = Item.objects.create(stock=1)
    stale = Item.objects.get(pk=item.pk)
    item.deduct()
    with pytest.raises(InsufficientStock) as info:
        stale.deduct()
    assert info.value.available == 0
    assert stock(item) == 0


# --- the lock lives as long as the outer transaction ---------------------------------


def test_lock_is_held_until_the_outer_transaction_commits() -> None:
    item = Item.objects.create(stock=5)
    with transaction.atomic():
        item.deduct()
        assert refused_elsewhere(lock_of(item).name)
        Order.objects.create(item=item, quantity=1)
        assert refused_elsewhere(lock_of(item).name)
    assert not lock_of(item).locked()
    assert watchdog.watching() == 0, "the lease is still being renewed"
    assert stock(item) == 4


def test_lock_is_released_when_the_outer_transaction_rolls_back() -> None:
    item = Item.objects.create(stock=5)
    with pytest.raises(RuntimeError), transaction.atomic():
        item.deduct()
        raise RuntimeError("payment failed")
    assert not lock_of(item).locked()
    assert watchdog.watching() == 0
    assert stock(item) == 5


def test_lock_outlives_a_rolled_back_savepoint_then_goes_with_the_commit() -> None:
    item = Item.objects.create(stock=5)
    with transaction.atomic():
        with contextlib.suppress(RuntimeError), transaction.atomic():
            item.deduct()
            raise RuntimeError("inner step failed")
        # the savepoint is gone, the outer transaction and the lock are not
        assert refused_elsewhere(lock_of(item).name)
    assert not lock_of(item).locked()
    assert watchdog.watching() == 0
    assert stock(item) == 5


def test_set_rollback_path_releases() -> None:
    item = Item.objects.create(stock=5)
    with transaction.atomic():
        item.deduct()
        transaction.set_rollback(True)
    assert not lock_of(item).locked()
    assert stock(item) == 5


def test_insufficient_stock_inside_outer_transaction_keeps_lock_until_end() -> None:
    item = Item.objects.create(stock=1)
    with transaction.atomic():
        with pytest.raises(InsufficientStock):
            item.deduct(2)
        assert refused_elsewhere(lock_of(item).name)
        item.deduct(1)  # the transaction is still usable
    assert not lock_of(item).locked()
    assert stock(item) == 0


def test_repeated_deductions_in_one_transaction_do_not_wait_on_themselves() -> None:
    item = Item.objects.create(stock=5)
    with transaction.atomic():
        for _ in range(3):
            item.deduct()
        Item.deduct_many({item: 1})
    assert stock(item) == 1
    assert not lock_of(item).locked()


def test_closing_the_connection_mid_transaction_releases(redis_client: redis.Redis) -> None:
    from django.db import connection

    item = Item.objects.create(stock=5)
    with transaction.atomic():
        item.deduct()
        connection.close()
        assert not lock_of(item).locked()


# --- carts ------------------------------------------------------------------------


def test_deduct_many_all_or_nothing() -> None:
    a, b = Item.objects.create(stock=5), Item.objects.create(stock=1)
    with pytest.raises(InsufficientStock) as info:
        Item.deduct_many({a: 2, b.pk: 2})
    assert info.value.item == b.pk
    assert info.value.available == 1
    assert (stock(a), stock(b)) == (5, 1)
    assert not lock_of(a).locked() and not lock_of(b).locked()
    assert Item.deduct_many({a: 2, str(b.pk): 1}) == {a.pk: 3, b.pk: 0}
    assert a.stock == 3


def test_deduct_many_takes_all_locks_together(other_thread: OtherThread) -> None:
    a, b = Item.objects.create(stock=5), Item.objects.create(stock=5)
    holder = Lock(Item.inventory_lock_name(b.pk), timeout=20)
    other_thread(holder.acquire)
    try:
        with pytest.raises(LockTimeout):
            _deduct_many_quick({a: 1, b: 1})
    finally:
        other_thread(holder.release)
    assert not lock_of(a).locked(), "the free part of the cart was left locked"
    assert (stock(a), stock(b)) == (5, 5)


def _deduct_many_quick(cart: dict[Any, int]) -> None:
    from django.test import override_settings

    with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0.2}):
        Item.deduct_many(cart)


@pytest.mark.parametrize(
    ("cart", "error", "match"),
    [
        ({}, ValueError, "must not be empty"),
        ([(1, 1)], TypeError, "mapping"),
        ({1: 0}, ValueError, "positive int"),
        ({"x": 1}, ValueError, "nor its primary key"),
    ],
)
def test_deduct_many_bad_carts(cart: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Item.deduct_many(cart)


def test_deduct_many_refuses_duplicates_and_other_models() -> None:
    item = Item.objects.create(stock=5)
    with pytest.raises(ValueError, match="more than once"):
        Item.deduct_many({item: 1, item.pk: 1})
    gadget = Gadget.objects.create(on_hand=1)
    with pytest.raises(TypeError, match="Gadget"):
        Item.deduct_many({gadget: 1})
    assert stock(item) == 5


def test_models_module_is_not_imported_by_the_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, django_redislock; "
        "assert 'django_redislock.models' not in sys.modules; "
        "assert 'django.contrib.contenttypes.models' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- real processes -----------------------------------------------------------------


@pytest.mark.slow
def test_eight_processes_sell_exactly_the_stock(redis_client: redis.Redis) -> None:
    item = Item.objects.create(stock=100)
    with processes(buy_loop, [(item.pk, 50)] * 8):
        pass
    assert int(redis_client.get("results:ok") or 0) == 100
    assert int(redis_client.get("results:short") or 0) == 300
    assert stock(item) == 0
    assert not lock_of(item).locked()


@pytest.mark.slow
def test_eight_processes_through_an_atomic_requests_view(redis_client: redis.Redis) -> None:
    import django
    from django.db import connection

    if connection.vendor == "sqlite" and django.VERSION < (5, 1):
        pytest.skip("SQLite under ATOMIC_REQUESTS needs transaction_mode (Django 5.1+)")
    item = Item.objects.create(stock=100)
    with processes(buy_via_view, [(item.pk, 50)] * 8):
        pass
    statuses = {
        k.decode(): int(v)
        for k in redis_client.scan_iter("results:*")
        if (v := redis_client.get(k))
    }
    assert statuses == {"results:200": 100, "results:409": 300}
    assert int(redis_client.get("results:409") or 0) == 300
    assert stock(item) == 0
    assert Order.objects.count() == 100
    assert not lock_of(item).locked()


@pytest.mark.slow
def test_overlapping_carts_in_opposite_orders_do_not_deadlock() -> None:
    a, b, c = (Item.objects.create(stock=1000) for _ in range(3))
    with processes(buy_carts, [([a.pk, b.pk, c.pk], 100), ([c.pk, b.pk, a.pk], 100)]):
        pass
    assert (stock(a), stock(b), stock(c)) == (800, 800, 800)


@pytest.mark.parametrize("returning", [True, False], ids=["returning", "update-then-select"])
def test_both_write_paths(monkeypatch: pytest.MonkeyPatch, returning: bool) -> None:
    if not returning:
        monkeypatch.setattr("django_redislock.models._update_returning_sql", lambda *args: None)
    gadget = Gadget.objects.create(on_hand=3)
    assert gadget.deduct(2) == 1
    with pytest.raises(InsufficientStock) as info:
        gadget.deduct(2)
    assert info.value.available == 1
    assert Gadget.deduct_many({gadget: 1}) == {gadget.pk: 0}
    assert Gadget.objects.get(pk=gadget.pk).on_hand == 0


def test_a_lease_lost_before_commit_does_not_break_the_commit(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    item = Item.objects.create(stock=5)
    with transaction.atomic():
        item.deduct()
        redis_client.delete(f"redislock:{{{lock_of(item).name}}}:lock")  # an operator clears it
    assert stock(item) == 4  # committed all the same: the guarded write kept it right
    assert "after the transaction ended" in caplog.text
    assert watchdog.watching() == 0


def test_a_multi_table_child_deducts_from_its_parents_row_under_the_parents_lock() -> None:
    """The stock column lives in the parent's table: the UPDATE must run there
    (it failed with "no such column"), and every class of the row (parent,
    child, proxy) must take one lock name (found by a review)."""
    special = SpecialItem.objects.create(stock=5, title="t")
    names = {cls.inventory_lock_name(special.pk) for cls in (Item, SpecialItem, ProxyItem)}
    assert names == {f"tests.item:{special.pk}"}
    assert special.deduct(2) == 3
    assert stock(special) == 3
    with pytest.raises(InsufficientStock):
        special.deduct(4)
    assert stock(special) == 3  # nothing changed
    assert SpecialItem.deduct_many({special.pk: 1}) == {special.pk: 2}
    assert ProxyItem.objects.get(pk=special.pk).deduct(2) == 0
    assert not Lock(f"tests.item:{special.pk}").locked()
    plain = Item.objects.create(stock=4)  # a parent row that is no SpecialItem
    with pytest.raises(SpecialItem.DoesNotExist):
        SpecialItem.deduct_many({plain.pk: 1})
    assert stock(plain) == 4


def test_restock_past_the_fields_range_is_refused_and_changes_nothing() -> None:
    """SQLite turned the stock into a float, PostgreSQL raised inside the
    transaction (found by a review)."""
    limit = Item._stock_limit()
    item = Item.objects.create(stock=limit - 10)
    with pytest.raises(ValueError, match=rf"past {limit}, the most it holds; nothing was changed"):
        item.restock(11)
    assert stock(item) == limit - 10 and isinstance(stock(item), int)
    assert item.restock(10) == limit
    assert stock(item) == limit and isinstance(stock(item), int)


def test_a_multi_table_child_restocks_its_parents_row_and_no_other() -> None:
    """Restocks write the table that holds the stock by itself, as deductions
    do (``_stock_row``); a parent row that is no child is still refused."""
    special = SpecialItem.objects.create(stock=1)
    assert special.restock(2) == 3
    assert stock(special) == 3
    plain = Item.objects.create(stock=4)
    with pytest.raises(SpecialItem.DoesNotExist):
        SpecialItem(pk=plain.pk).restock(1)
    assert stock(plain) == 4


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_snapshot_older_than_the_lock_fails_the_deduction_on_postgresql(level: str) -> None:
    """As docs/inventory.md says: at these isolation levels a transaction sees
    the rows as of its first statement, so one that read before it had the
    item's lock cannot write a row another buyer changed since. PostgreSQL
    refuses the write (a serialization failure to retry), never oversells,
    and the lock goes with the rollback."""
    from django.db import OperationalError, connection

    if connection.vendor != "postgresql":
        pytest.skip("isolation levels of PostgreSQL")
    item = Item.objects.create(stock=5)
    commands, events = CTX.Queue(), CTX.Queue()
    with processes(buy_on_command, [(item.pk, commands, events)]):
        with pytest.raises(OperationalError, match="could not serialize"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            assert stock(item) == 5  # the snapshot is taken here
            commands.put("buy")
            assert events.get(timeout=60) == ("bought", 4)  # another buyer, committed
            item.deduct(1)
    assert stock(item) == 4
    assert not lock_of(item).locked()


def test_a_transaction_that_can_only_roll_back_takes_no_lock() -> None:
    """An error Django marked for rollback (a failed save the caller caught)
    leaves the transaction unable to run queries: the deduction took the
    item's lock before failing on its first query, and kept it from every
    other buyer until that transaction ended (found by a review)."""
    from django.db import IntegrityError
    from django.db.transaction import TransactionManagementError

    item = Item.objects.create(stock=5)
    with transaction.atomic():
        with contextlib.suppress(IntegrityError):
            Order.objects.create(item=item, quantity=-1)  # the CHECK refuses it
        with pytest.raises(TransactionManagementError):
            item.deduct()
        assert not lock_of(item).locked()
        with pytest.raises(TransactionManagementError):
            Item.deduct_many({item: 1})
        assert not lock_of(item).locked()
    assert stock(item) == 5


def test_the_documented_buy_view_answers_200_422_and_423(other_thread: OtherThread) -> None:
    """docs/inventory.md's ``buy`` view, run from the page with the suite's ``Item``
    as its ``SKU``: what is left, 422 when sold out (not the 409 of a lost
    lock, which a client retries), 423 with a whole-second ``Retry-After``
    when the item's lock is held elsewhere."""
    import json
    import re
    from pathlib import Path

    from django.test import RequestFactory, override_settings

    page = Path(__file__).resolve().parent.parent / "docs" / "inventory.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if "def buy(" in block]
    namespace: dict[str, Any] = {"SKU": Item}
    exec(compile(code, str(page), "exec"), namespace)

    def buy(item: Item) -> Any:
        return namespace["buy"](RequestFactory().post(f"/buy/{item.pk}/"), pk=item.pk)

    item = Item.objects.create(stock=1)
    assert buy(item).content == b'{"left": 0}'
    sold_out = buy(item)
    assert sold_out.status_code == 422 and "Retry-After" not in sold_out
    body = json.loads(sold_out.content)
    assert body == {"detail": "Only 0 left.", "code": "insufficient_stock", "available": 0}
    holder = Lock(Item.inventory_lock_name(item.pk), timeout=20)
    other_thread(holder.acquire)
    try:
        with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0.1}):
            busy = buy(item)
    finally:
        other_thread(holder.release)
    assert busy.status_code == 423 and json.loads(busy.content)["code"] == "lock_busy"
    assert 1 <= int(busy["Retry-After"]) <= 20
