"""A retried purchase deducts once, whatever the timing of the retries: real
processes fire the same ``Idempotency-Key`` at an ``InventoryMixin`` buy view
while the first runs and after it finished (``docs/once.md``)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
import redis

from tests.models import Item
from tests.support.once_workers import retry_purchase
from tests.support.procs import CTX, processes, reap, start_one

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_redis"),
]


def answers(client: redis.Redis) -> list[tuple[str, int, bool, str]]:
    return [tuple(json.loads(raw)) for raw in client.lrange("once:answers", 0, -1)]  # type: ignore[misc]


def stock(item: Item) -> int:
    return Item.objects.values_list("stock", flat=True).get(pk=item.pk)


def test_retries_while_the_first_runs_get_409_and_after_it_its_response(
    redis_client: redis.Redis,
) -> None:
    item = Item.objects.create(stock=10)
    first = start_one(retry_purchase, f"/buy-gated/{item.pk}/", ["order-1"], None, False)
    try:
        assert redis_client.blpop(["once:entered"], timeout=60), "the first never ran"
        assert stock(item) == 9  # deducted and committed; its response not stored yet
        with processes(retry_purchase, [(f"/buy-gated/{item.pk}/", ["order-1"], None, False)] * 3):
            pass
        assert [(status, replayed) for _, status, replayed, _ in answers(redis_client)] == [
            (409, False)
        ] * 3
        redis_client.rpush("once:go", "1")
        first.join(60)
        assert first.exitcode == 0
    finally:
        reap([first])
    redis_client.delete("once:answers")
    with processes(retry_purchase, [(f"/buy-gated/{item.pk}/", ["order-1"], None, False)] * 3):
        pass
    replays = answers(redis_client)
    assert {(status, replayed) for _, status, replayed, _ in replays} == {(201, True)}
    assert len({body for *_, body in replays}) == 1
    assert stock(item) == 9


def test_a_storm_of_retries_of_two_orders_deducts_exactly_twice(redis_client: redis.Redis) -> None:
    import django
    from django.db import connection

    if connection.vendor == "sqlite" and django.VERSION < (5, 1):
        pytest.skip("SQLite under ATOMIC_REQUESTS needs transaction_mode (Django 5.1+)")
    item = Item.objects.create(stock=100)
    start = CTX.Barrier(6)
    keys = ["order-a", "order-b"] * 5  # each process retries both orders five times
    with processes(retry_purchase, [(f"/buy/{item.pk}/", keys, start, True)] * 6):
        pass
    by_key: dict[str, list[Any]] = defaultdict(list)
    for key, status, replayed, body in answers(redis_client):
        by_key[key].append((status, replayed, body))
    for key, seen in by_key.items():
        assert len(seen) == 30
        firsts = [body for status, replayed, body in seen if status == 201 and not replayed]
        assert len(firsts) == 1, key  # one run per key...
        replays = [body for status, replayed, body in seen if replayed]
        assert set(replays) <= set(firsts)  # ...which every replay repeats byte for byte
        assert {status for status, _, _ in seen} <= {201, 409}
    assert stock(item) == 98
