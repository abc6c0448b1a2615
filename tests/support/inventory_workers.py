"""Worker bodies for the inventory process tests.

A separate module that imports no models at import time: spawned workers
unpickle their target by importing its module before Django is set up.
"""

from __future__ import annotations

from typing import Any


def buy_loop(pk: int, rounds: int) -> None:
    from django_redislock import InsufficientStock
    from django_redislock.backend.client import get_client
    from tests.models import Item

    client = get_client("default")
    item = Item.objects.get(pk=pk)
    for _ in range(rounds):
        try:
            left = item.deduct(1)
        except InsufficientStock:
            client.incr("results:short")
        else:
            assert left >= 0
            client.incr("results:ok")


def buy_via_view(pk: int, rounds: int) -> None:
    from django.conf import settings
    from django.test import Client, override_settings
    from django.test.utils import setup_test_environment

    from django_redislock.backend.client import get_client

    setup_test_environment()  # ALLOWED_HOSTS gets "testserver", as in the parent
    database = settings.DATABASES["default"]
    database["ATOMIC_REQUESTS"] = True
    if database["ENGINE"].endswith("sqlite3"):
        # A request transaction reads before it writes: with SQLite's default
        # deferred BEGIN, two such transactions deadlock on the file lock. See
        # docs/inventory.md.
        database["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    client = get_client("default")
    with override_settings(ROOT_URLCONF="tests.support.lock_views"):
        http = Client()
        for _ in range(rounds):
            status = http.post(f"/deduct/{pk}/").status_code
            client.incr(f"results:{status}")


def buy_carts(pks: list[int], rounds: int) -> None:
    from tests.models import Item

    for _ in range(rounds):
        Item.deduct_many(dict.fromkeys(pks, 1))


def buy_on_command(pk: int, commands: Any, events: Any) -> None:
    """One ``deduct(1)``, when told to; says when it has committed."""
    from tests.models import Item

    assert commands.get(timeout=60) == "buy"
    events.put(("bought", Item.objects.get(pk=pk).deduct(1)))
