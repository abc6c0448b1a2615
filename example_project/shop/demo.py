"""Worker processes for ``oversell_demo``.

Imports no models at import time: ``spawn`` workers import this module before
Django is set up.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

ATTEMPTS_KEY = "oversell-demo:attempts"
TIMEOUTS_KEY = "oversell-demo:timeouts"


def run_worker(mode: str, pk: int, attempts: int, think_ms: float, barrier: Any) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    import redis

    counter = redis.Redis.from_url(os.environ["REDIS_URL"])
    buy = naive_buy if mode == "naive" else locked_buy
    try:
        barrier.wait()
    except threading.BrokenBarrierError:  # another worker died: the demo says so
        return
    for _ in range(attempts):
        buy(pk, think_ms / 1000.0, counter)
        counter.incr(ATTEMPTS_KEY)


def naive_buy(pk: int, think: float, counter: Any) -> None:
    """What the seeds' stories start from: read, check, (pay), write."""
    from example_project.shop.models import SKU, Order

    sku = SKU.objects.get(pk=pk)
    if sku.stock >= 1:
        time.sleep(think)  # the payment call between the read and the write
        sku.stock -= 1
        sku.save(update_fields=["stock"])
        Order.objects.create(sku=sku, buyer="naive")


def locked_buy(pk: int, think: float, counter: Any) -> None:
    """The same purchase with ``deduct()``: the item lock is held until commit."""
    from django.db import transaction

    from django_redislock import InsufficientStock, LockTimeout
    from example_project.shop.models import SKU, Order

    sku = SKU(pk=pk)
    try:
        with transaction.atomic():
            sku.deduct(1)
            time.sleep(think)
            Order.objects.create(sku=sku, buyer="deduct")
    except InsufficientStock:
        pass
    except LockTimeout:
        counter.incr(TIMEOUTS_KEY)
