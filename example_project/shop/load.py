"""Concurrent buyers against the shop, so the lock dashboard has something to show.

Each buyer is a thread with its own Django test ``Client`` posting to the real
buy view (URL routing, middleware, ``@require_lock("sku:<pk>")``,
``deduct()``, the database), with ``think_ms`` of simulated payment inside
the lock through a ``Semaphore("payment-provider", 2)``: holders stay long
enough to be seen, queues form behind them, and the hot-names panel fills.
Sold-out SKUs are restocked so the run never runs dry. A ``report:daily``
lock is held for the whole run, described as the load run itself.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import close_old_connections
from django.test import Client
from django.urls import reverse

from django_redislock import Lock, LockTimeout
from django_redislock.context import describe_holder

from .models import SKU

RESTOCK = 20
#: What the tally counts a redirect as (not HTTP statuses), from the buy
#: view's answer (both outcomes redirect to the shop page).
BOUGHT, SOLD_OUT = "bought", "sold out"
OUTCOME_HEADER = "X-Shop-Outcome"


@dataclass
class Tally:
    """What the buyers saw; shared by the buyer threads under ``lock``."""

    counts: Counter[int | str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, status: int | str) -> None:
        with self.lock:
            self.counts[status] += 1

    def summary(self) -> str:
        with self.lock:
            counts = dict(self.counts)
        bought = counts.pop(BOUGHT, 0)
        locked = counts.pop(423, 0)
        others = ", ".join(f"{n} x {status}" for status, n in sorted(counts.items(), key=str))
        return f"{bought} bought, {locked} answered 423" + (f", {others}" if others else "")


def _buyer(
    pks: list[int], until: float, think_ms: int, tally: Tally, stop: threading.Event
) -> None:
    # a 500 is counted, not raised into (and ending) the buyer's thread
    client = Client(SERVER_NAME="127.0.0.1", raise_request_exception=False)
    rng = random.Random()
    try:
        while time.monotonic() < until and not stop.is_set():
            pk = pks[0] if rng.random() < 0.6 else rng.choice(pks)  # one SKU is hot
            response = client.post(reverse("shop:buy", args=[pk]), {"think_ms": think_ms})
            status: int | str = response.status_code
            if status == 302:  # a purchase, or "sold out": the view says which
                status = BOUGHT if response.get(OUTCOME_HEADER) == BOUGHT else SOLD_OUT
            tally.add(status)
            if SKU.objects.filter(pk=pk, stock=0).exists():
                SKU.objects.get(pk=pk).restock(RESTOCK)
    finally:
        close_old_connections()


def run(
    *,
    seconds: float,
    buyers: int,
    think_ms: int = 150,
    progress: Callable[[float, Tally], None] | None = None,
) -> Tally:
    """Run ``buyers`` threads for ``seconds``; ``progress(elapsed, tally)`` ~4 times a second."""
    pks = list(SKU.objects.order_by("pk").values_list("pk", flat=True))
    if not pks:
        raise ValueError("The shop has no SKUs: run `manage.py seed_shop` first.")
    tally, stop = Tally(), threading.Event()
    started = time.monotonic()
    until = started + seconds
    with (
        describe_holder(f"shop_load: {buyers} buyers for {seconds:g} s"),
        Lock("report:daily", timeout=30),
    ):
        threads = [
            threading.Thread(
                target=_buyer, args=(pks, until, think_ms, tally, stop), name=f"buyer-{i + 1}"
            )
            for i in range(buyers)
        ]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                if progress is not None:
                    progress(min(time.monotonic() - started, seconds), tally)
                threads[0].join(0.25)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    if progress is not None:
        progress(seconds, tally)
    return tally


def start_in_background(*, seconds: float, buyers: int) -> bool:
    """Start a run in a daemon thread, unless one is running (``False`` then).

    The run holds the ``shop:load`` lock, so a second click (or another web
    process) does not start a second run at the same time.
    """
    if Lock("shop:load").locked():
        return False

    def main() -> None:
        try:
            with Lock("shop:load", blocking=False):
                run(seconds=seconds, buyers=buyers)
        except LockTimeout:
            pass  # another run started in between
        finally:
            close_old_connections()

    threading.Thread(target=main, name="shop-load", daemon=True).start()
    return True
