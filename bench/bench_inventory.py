"""Orders per second of ``InventoryMixin.deduct(1)`` beside its peers, on PostgreSQL.

    DATABASE_URL=postgres://redislock:redislock@127.0.0.1:5432/redislock \\
        .venv/bin/python bench/bench_inventory.py [--workers 8] [--orders 30] [--rounds 3]

Every flow runs ``--workers`` processes, each buying ``--orders`` times one unit
of ONE hot item whose stock is exactly the number of orders, in one run:

- ``deduct()``: ours (item lock until commit + guarded UPDATE);
- ``redis-py Lock``: the same flow (lock, transaction, guarded UPDATE, read
  back, commit, release) under redis-py's ``Lock`` with its defaults;
- ``select_for_update``: the row lock alone (SELECT ... FOR UPDATE, check, save);
- ``bare UPDATE``: one conditional UPDATE in autocommit, no lock at all: the
  database floor, the fastest anything correct can be.

It prints orders/s, ratios and oversell (sold beyond the stock, or a final
stock that is not 0). The database used is ``<name>_bench_inventory`` (created
if missing); Redis is ``REDIS_URL`` or a private redis-server.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FLOWS = ["deduct()", "redis-py Lock", "select_for_update", "bare UPDATE"]


def _setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def _buy_deduct(pk: int) -> bool:
    from django_redislock import InsufficientStock
    from tests.models import Item

    try:
        Item(pk=pk).deduct(1)
    except InsufficientStock:
        return False
    return True


def _make_redis_py_flow() -> Any:
    """deduct()'s flow, write for write, with redis-py's Lock instead of ours."""
    from django.db import connection, transaction

    from django_redislock.backend.client import get_client
    from django_redislock.models import _update_returning_sql
    from tests.models import Item

    client = get_client("default")
    sql = _update_returning_sql(Item, connection)
    assert sql is not None

    def buy(pk: int) -> bool:
        lock = client.lock(f"bench-redis-py:{pk}", timeout=30, blocking_timeout=60)
        with lock, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [1, pk, 1])
            return cursor.fetchone() is not None

    return buy


def _buy_select_for_update(pk: int) -> bool:
    from django.db import transaction

    from tests.models import Item

    with transaction.atomic():
        item = Item.objects.select_for_update().get(pk=pk)
        if item.stock < 1:
            return False
        item.stock -= 1
        item.save(update_fields=["stock"])
        return True


def _buy_bare_update(pk: int) -> bool:
    from django.db.models import F

    from tests.models import Item

    return bool(Item.objects.filter(pk=pk, stock__gte=1).update(stock=F("stock") - 1))


def _worker(
    env: dict[str, str], flow: str, pk: int, warm_pk: int, orders: int, barrier: Any, out: Any
) -> None:
    _setup(env)
    buy = {
        "deduct()": _buy_deduct,
        "redis-py Lock": _make_redis_py_flow(),
        "select_for_update": _buy_select_for_update,
        "bare UPDATE": _buy_bare_update,
    }[flow]
    buy(warm_pk)  # warm up connections and scripts on another item
    barrier.wait()
    sold = sum(buy(pk) for _ in range(orders))
    out.put((sold, time.monotonic()))


def _run_flow(
    ctx: Any, env: dict[str, str], flow: str, workers: int, orders: int
) -> tuple[float, int, int]:
    """One timed run of ``flow``: (orders/s, sold, oversold)."""
    from django.db import connections

    from tests.models import Item

    total = workers * orders
    item = Item.objects.create(stock=total)
    warm = Item.objects.create(stock=workers)
    connections.close_all()
    barrier = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(env, flow, item.pk, warm.pk, orders, barrier, out))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    started = time.monotonic()
    reports = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(30)
    seconds = max(end for _, end in reports) - started
    sold = sum(s for s, _ in reports)
    left = Item.objects.get(pk=item.pk).stock
    # oversold: sold beyond the stock, or stock that the sales do not account for
    oversold = max(0, sold - total) + abs((total - sold) - left)
    return total / seconds, sold, oversold


def _bench_database(url: str) -> str:
    """The bench's own database next to the one in ``url``, created if missing."""
    import psycopg

    parsed = urlparse(url)
    name = (parsed.path.lstrip("/") or "postgres") + "_bench_inventory"
    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path="/" + name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--orders", type=int, default=30, help="orders per worker per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each flow (median)")
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL", "postgres://redislock:redislock@127.0.0.1:5432/redislock")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("bench_inventory needs DATABASE_URL=postgres://...")
    server = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        from tests.support.servers import RedisServer

        server = RedisServer().start()
        redis_url = server.url
    env = {"DATABASE_URL": _bench_database(url), "REDISLOCK_TEST_REDIS_URL": redis_url}
    _setup(env)
    from django.db import connection

    from tests.models import Item

    with connection.schema_editor() as editor:
        connection.cursor().execute(f'DROP TABLE IF EXISTS "{Item._meta.db_table}" CASCADE')
        editor.create_model(Item)

    total = args.workers * args.orders
    ctx = multiprocessing.get_context("spawn")
    runs: dict[str, list[float]] = {}
    oversells: dict[str, int] = {}
    try:
        for round_ in range(args.rounds):
            # rotate the order each round: load on a shared box drifts over time
            order = FLOWS[round_ % len(FLOWS) :] + FLOWS[: round_ % len(FLOWS)]
            for flow in order:
                rate, sold, oversold = _run_flow(ctx, env, flow, args.workers, args.orders)
                runs.setdefault(flow, []).append(rate)
                oversells[flow] = oversells.get(flow, 0) + oversold
                print(
                    f"  round {round_ + 1} {flow:<18} {rate:8.0f} orders/s  sold {sold}/{total}"
                    f"{', OVERSOLD ' + str(oversold) if oversold else ''}",
                    flush=True,
                )
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(Item)
        if server is not None:
            server.stop()

    rates = {flow: statistics.median(values) for flow, values in runs.items()}
    sfu = rates["select_for_update"]
    floor = rates["bare UPDATE"]
    print()
    print(
        f"{args.workers} processes x {args.orders} orders of one hot item, PostgreSQL, "
        f"median of {args.rounds} rounds"
    )
    print(
        f"{'flow':<20}{'orders/s':>10}{'vs select_for_update':>22}{'vs floor':>10}{'oversold':>10}"
    )
    for flow in FLOWS:
        rate, oversold = rates[flow], oversells[flow]
        print(f"{flow:<20}{rate:>10.0f}{rate / sfu:>21.2f}x{rate / floor:>9.2f}x{oversold:>10}")
    ratio = rates["deduct()"] / sfu
    verdict = "meets" if ratio >= 0.8 else "MISSES"
    print(f"\ndeduct() is {ratio:.2f}x select_for_update ({verdict} the 0.8x target).")


if __name__ == "__main__":
    main()
