"""What a holder runs, as operators see it in the lock's holder description."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import redis
from django.http import HttpResponse
from django.test import RequestFactory

from django_redislock import Lock, Semaphore, require_lock
from django_redislock.context import (
    MAX_LENGTH,
    HolderContextMiddleware,
    current,
    describe_holder,
    split,
)
from django_redislock.ops.inspection import describe


def holder_of(client: redis.Redis, name: str) -> str:
    return describe(client, "redislock", name)[0].holders[0].holder


def test_describe_holder_is_recorded_and_restored(redis_client: redis.Redis) -> None:
    with describe_holder("nightly invoices"), Lock("inv"):
        who, what = split(holder_of(redis_client, "inv"))
    assert what == "nightly invoices"
    assert who.endswith(":" + threading.current_thread().name)
    with Lock("inv"):
        assert split(holder_of(redis_client, "inv"))[1] in ("", "manage.py pytest")
    with describe_holder("outer"), describe_holder("inner"):
        assert current() == "inner"


def test_semaphore_holders_are_described(redis_client: redis.Redis) -> None:
    with describe_holder("batch 7"), Semaphore("pool", 2):
        assert split(holder_of(redis_client, "pool"))[1] == "batch 7"


def test_description_is_one_short_printable_line() -> None:
    with describe_holder("a\nb | c\ud800" + "x" * 500):
        text = current()
    assert text is not None
    assert len(text) == MAX_LENGTH
    assert text.startswith("a?b / c?x")
    assert text.endswith("…")
    text.encode("utf-8")  # no lone surrogate reaches Redis


def test_require_lock_describes_the_request(redis_client: redis.Redis) -> None:
    seen: list[str] = []

    @require_lock("sku:<pk>")
    def buy(request: object, pk: int) -> HttpResponse:
        seen.append(holder_of(redis_client, f"sku:{pk}"))
        return HttpResponse()

    buy(RequestFactory().post("/shop/buy/42/"), pk=42)
    assert split(seen[0])[1] == "POST /shop/buy/42/"


def test_middleware_describes_locks_a_view_takes(redis_client: redis.Redis) -> None:
    seen: list[str] = []

    def view(request: object) -> HttpResponse:
        with Lock("report"):
            seen.append(holder_of(redis_client, "report"))
        return HttpResponse()

    HolderContextMiddleware(view)(RequestFactory().get("/reports/"))
    assert split(seen[0])[1] == "GET /reports/"
    assert current() != "GET /reports/"  # nothing leaks into the thread's next request


def test_celery_task_name_without_importing_celery(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("celery")
    fake.current_task = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "celery", fake)
    monkeypatch.setattr(sys, "argv", ["worker"])
    assert current() is None
    fake.current_task = types.SimpleNamespace(name="shop.tasks.restock")  # type: ignore[attr-defined]
    assert current() == "task shop.tasks.restock"
    with describe_holder("mine"):
        assert current() == "mine"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/srv/manage.py", "close_orders", "--all"], "manage.py close_orders"),
        (["manage.py", "runserver"], None),
        (["gunicorn", "site.wsgi"], None),
    ],
)
def test_management_command(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str | None
) -> None:
    monkeypatch.delitem(sys.modules, "celery", raising=False)
    monkeypatch.setattr(sys, "argv", argv)
    assert current() == expected


def test_middleware_in_an_async_stack(redis_client: redis.Redis) -> None:
    import asyncio

    from django_redislock import AsyncLock

    seen: list[str] = []

    async def view(request: object) -> HttpResponse:
        async with AsyncLock("async-report"):
            seen.append(holder_of(redis_client, "async-report"))
        return HttpResponse()

    middleware = HolderContextMiddleware(view)
    response = asyncio.run(middleware(RequestFactory().get("/async/")))
    assert response.status_code == 200
    assert split(seen[0])[1] == "GET /async/"
