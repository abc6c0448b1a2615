"""``@idempotent`` on Django REST framework views: an ``APIView`` handler, a
viewset action, an ``@api_view`` function; DRF's JSON error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client, override_settings

pytest.importorskip("rest_framework")
pytestmark = pytest.mark.usefixtures("real_redis")


@pytest.fixture(autouse=True)
def _drf_urls() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.once_drf_views"):
        yield


def post(path: str, body: object, key: str | None = "k-1") -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return Client().post(path, json.dumps(body), content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    ("path", "view"),
    [("/orders/", "apiview"), ("/viewset/", "viewset"), ("/function/", "function")],
)
def test_a_drf_response_is_rendered_stored_and_replayed(
    path: str, view: str, redis_client: redis.Redis
) -> None:
    first = post(path, {"sku": 1})
    again = post(path, {"sku": 1})
    assert first.status_code == again.status_code == 201
    assert first.json()["data"] == {"sku": 1}
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"] == "application/json"
    assert again["Location"] == "/orders/7/"
    assert again["Idempotent-Replayed"] == "true"
    assert int(redis_client.get(f"once:runs:{view}") or 0) == 1


@pytest.mark.parametrize("path", ["/orders/", "/viewset/", "/function/"])
def test_drf_views_get_json_errors(path: str) -> None:
    assert post(path, {"sku": 1}).status_code == 201
    mismatch = post(path, {"sku": 2})
    assert mismatch.status_code == 422
    assert "different request body" in mismatch.json()["detail"]
    assert mismatch.json()["code"] == "idempotency_key_mismatch"
    malformed = post(path, {"sku": 1}, key="a b")
    assert malformed.status_code == 400 and "Idempotency-Key" in malformed.json()["detail"]


def test_a_required_key_missing_is_a_json_400() -> None:
    missing = post("/orders/", {"sku": 1}, key=None)
    assert missing.status_code == 400
    assert missing.json() == {
        "detail": "This request needs an Idempotency-Key header.",
        "code": "idempotency_key_missing",
    }
