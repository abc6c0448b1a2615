"""DRF: where ``@require_lock`` sits relative to authentication, permissions and
throttling, and ViewSet actions (``docs/drf.md``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import caches
from django.test import Client, override_settings

from django_redislock import Lock
from django_redislock import signals as lock_signals
from tests.holders import OtherThread
from tests.signals_helper import capture

pytest.importorskip("rest_framework")


@pytest.fixture(autouse=True)
def _drf_urls() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.drf_views"):
        yield


def acquired(name: str, calls: list[dict[str, object]]) -> int:
    return sum(1 for call in calls if call["name"] == name)


def test_a_lock_on_the_handler_is_taken_after_authentication_and_permissions() -> None:
    with capture(lock_signals.lock_acquired) as calls:
        response = Client().get("/guarded/1/")
    assert response.status_code == 403  # refused by the permission check...
    assert acquired("report:1", calls) == 0  # ...without ever taking the lock


def test_a_lock_on_dispatch_is_taken_before_them() -> None:
    with capture(lock_signals.lock_acquired) as calls:
        response = Client().get("/guarded-dispatch/1/")
    assert response.status_code == 403
    assert acquired("report:1", calls) == 1  # taken (and released) for a refused request


def test_a_throttled_request_never_takes_the_lock() -> None:
    caches["default"].clear()
    with capture(lock_signals.lock_acquired) as calls:
        assert Client().get("/throttled/2/").status_code == 200
        assert Client().get("/throttled/2/").status_code == 429
    assert acquired("report:2", calls) == 1


def test_viewset_actions_lock_per_object(other_thread: OtherThread) -> None:
    client = Client()
    assert client.get("/skus/5/").json() == {"ok": True}
    assert client.post("/skus/5/buy/").json() == {"bought": "5"}
    holder = Lock("sku:5")
    other_thread(holder.acquire)
    try:
        busy = client.post("/skus/5/buy/")
        assert busy.status_code == 423
        assert "detail" in busy.json()
        assert "Retry-After" in busy
        assert client.post("/skus/6/buy/").status_code == 200  # another object
    finally:
        other_thread(holder.release)
