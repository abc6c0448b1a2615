"""DRF: where ``@require_lock`` sits relative to authentication, permissions and
throttling, and ViewSet actions (``docs/drf.md``); the page's own views at the end."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import caches
from django.test import Client, override_settings

from django_redislock import Lock
from django_redislock import signals as lock_signals
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture

pytest.importorskip("rest_framework")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "drf.md"


@pytest.fixture(autouse=True)
def _drf_urls() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.drf_views"):
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


@pytest.fixture
def page_urls() -> Iterator[None]:
    """The page's views, as written there, routed as a project would route them."""
    from django.urls import path
    from rest_framework.routers import SimpleRouter

    [code] = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    module = types.ModuleType("drf_page_urls")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    router = SimpleRouter()
    router.register("skus", module.SkuViewSet, basename="sku")
    module.urlpatterns = [path("reports/<int:pk>/", module.ReportView.as_view()), *router.urls]
    sys.modules[module.__name__] = module
    try:
        with override_settings(ROOT_URLCONF=module.__name__, REDISLOCK={"BLOCKING_TIMEOUT": 0.2}):
            yield
    finally:
        del sys.modules[module.__name__]


@pytest.mark.usefixtures("page_urls")
def test_the_pages_views_lock_after_permissions_and_per_object(other_thread: OtherThread) -> None:
    client = Client()
    with capture(lock_signals.lock_acquired) as calls:
        refused = client.post("/reports/1/")
    assert refused.status_code in (401, 403)  # IsAuthenticated...
    assert acquired("report:1", calls) == 0  # ...before the lock
    assert client.post("/skus/5/buy/").json() == {"bought": "5"}
    holder = Lock("sku:5")
    other_thread(holder.acquire)
    try:
        busy = client.post("/skus/5/buy/")
        assert busy.status_code == 423
        assert "detail" in busy.json() and int(busy["Retry-After"]) >= 1
        assert client.post("/skus/6/buy/").json() == {"bought": "6"}
    finally:
        other_thread(holder.release)
