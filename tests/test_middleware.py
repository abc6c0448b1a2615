"""``LockErrorMiddleware``: a lock failure that escapes a view is a 409 or a 503,
not Django's 500 (the one ``@require_lock`` cannot answer itself: a loss between
the view's return and its transaction's commit)."""

from __future__ import annotations

import time

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_redislock import Lock, LockBackendError, require_lock
from django_redislock.checks import LOCK_ERROR_MIDDLEWARE, check_middleware, middleware_problem
from tests.models import Item
from tests.support.other_holders import OtherThread

LEASE = 1.0
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    LOCK_ERROR_MIDDLEWARE,
]

#: The test's other holder, for the view (set by the test that needs it).
OTHER: list[OtherThread] = []


@require_lock("retitle:<pk>", timeout=LEASE)
def retitle(pk: int) -> None:
    Item.objects.filter(pk=pk).update(title="committed past the lease")


@transaction.atomic  # as ATOMIC_REQUESTS wraps a view: the commit is outside the decorator
def lost_before_the_commit(request: HttpRequest, pk: int) -> HttpResponse:
    retitle(pk)  # confirmed on the way out and handed to this transaction
    holding = Lock(f"retitle:{pk}")._holding()
    assert holding is not None
    taker = Lock(f"retitle:{pk}", timeout=30, auto_renew=False)
    # another holder takes the name once the lease ran out (nothing renews it)
    assert OTHER[0](taker.acquire, blocking_timeout=LEASE + 15), "the lease never ran out"
    assert time.monotonic() >= holding.lease_deadline
    return HttpResponse("done")  # the commit after this raises LockLostError


def backend_down(request: HttpRequest) -> HttpResponse:
    raise LockBackendError("Redis is unreachable", name="sku:1")


def other_error(request: HttpRequest) -> HttpResponse:
    raise ValueError("not a lock error")


urlpatterns = [
    path("lost/<int:pk>/", lost_before_the_commit),
    path("down/", backend_down),
    path("other/", other_error),
]


@pytest.fixture
def client() -> Client:
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE):
        yield Client(raise_request_exception=True)


@pytest.mark.django_db(transaction=True)
def test_a_lock_lost_before_the_commit_is_a_409_and_nothing_is_saved(
    client: Client, other_thread: OtherThread
) -> None:
    item = Item.objects.create(stock=5, title="before")
    OTHER[:] = [other_thread]
    with override_settings(REDISLOCK={"AUTO_RENEW": False}):
        response = client.get(f"/lost/{item.pk}/")
    assert response.status_code == 409
    assert int(response["Retry-After"]) >= 1
    assert "nothing it changed was saved" in response.content.decode()
    item.refresh_from_db()
    assert item.title == "before"  # the commit rolled back


def test_a_lock_outage_escaping_a_view_is_a_503(client: Client) -> None:
    response = client.get("/down/")
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1


def test_other_errors_are_left_to_django(client: Client) -> None:
    with pytest.raises(ValueError, match="not a lock error"):
        client.get("/other/")


def test_without_the_middleware_the_loss_is_djangos_500(other_thread: OtherThread) -> None:
    """What the middleware is for: the decorator cannot answer it."""
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE[:2]):
        with pytest.raises(LockBackendError):
            Client(raise_request_exception=True).get("/down/")


@pytest.mark.parametrize(
    ("atomic", "middleware", "warned"),
    [(True, [], True), (True, [LOCK_ERROR_MIDDLEWARE], False), (False, [], False)],
)
def test_w004_asks_for_the_middleware_under_atomic_requests(
    atomic: bool, middleware: list[str], warned: bool
) -> None:
    databases = {"default": {"ATOMIC_REQUESTS": atomic}, "other": {}}
    problem = middleware_problem(databases, middleware)
    assert (problem is not None and problem.id == "django_redislock.W004") is warned
    assert check_middleware() == []  # the suite's own settings have no ATOMIC_REQUESTS
