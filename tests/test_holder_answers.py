"""The 423 of ``@require_lock`` says who holds the name and for how long, to
staff only (``responses.holder_shown``); plain and DRF answers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory, override_settings

from django_redislock import Lock
from django_redislock.context import describe_holder
from django_redislock.responses import holder_shown
from tests.support.other_holders import OtherThread

pytest.importorskip("rest_framework")

from tests.support.holder_views import StaffUser, plain

BUSY = "who:7 is busy; try again shortly.\n"


@pytest.fixture(autouse=True)
def _views() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.holder_views"):
        yield


@pytest.fixture
def held(other_thread: OtherThread) -> Iterator[None]:
    lock = Lock("who:7", timeout=30)

    def take() -> bool:
        with describe_holder("task shop.tasks.export"):
            return lock.acquire()

    assert other_thread(take)
    yield
    other_thread(lock.release)


def plain_answer(user: Any) -> Any:
    request = RequestFactory().get("/plain/7/")
    request.user = user
    return plain(request, pk=7)


@pytest.mark.usefixtures("held")
def test_a_plain_423_tells_staff_who_holds_it_and_for_how_long() -> None:
    response = plain_answer(StaffUser())
    assert response.status_code == 423
    text = response.content.decode()
    match = re.fullmatch(
        rf"who:7 is busy \(held by \S+ pid {os.getpid()} \(task shop\.tasks\.export\) "
        r"for (\d+\.\d) s\); try again shortly\.\n",
        text,
    )
    assert match is not None, text
    assert 0.0 <= float(match.group(1)) < 30


@pytest.mark.usefixtures("held")
def test_a_plain_423_to_anyone_else_is_as_before() -> None:
    for user in (AnonymousUser(), None):
        response = plain_answer(user)
        assert response.status_code == 423
        assert response.content.decode() == BUSY
    not_staff = StaffUser()
    not_staff.is_staff = False  # type: ignore[misc]
    assert plain_answer(not_staff).content.decode() == BUSY


@pytest.mark.usefixtures("held")
def test_a_drf_423_has_holder_fields_for_staff_only() -> None:
    staff = Client().get("/api/7/", HTTP_X_STAFF="1")
    assert staff.status_code == 423
    body = staff.json()
    assert body["code"] == "lock_busy"
    assert body["holder"]["pid"] == os.getpid()
    assert body["holder"]["runs"] == "task shop.tasks.export"
    assert body["holder"]["thread"].startswith("other-holder")
    assert set(body["holder"]) == {"host", "pid", "thread", "runs", "since"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", body["holder"]["since"])
    assert isinstance(body["held_for"], float) and 0.0 <= body["held_for"] < 30
    assert "token" not in str(body)
    anonymous = Client().get("/api/7/")
    assert anonymous.status_code == 423
    assert anonymous.json() == {"detail": BUSY.strip(), "code": "lock_busy"}


def test_a_user_that_cannot_be_read_is_not_staff() -> None:
    class Broken:
        @property
        def user(self) -> Any:
            raise RuntimeError("authentication failed")

    assert not holder_shown(Broken())
    assert not holder_shown(object())
