"""A detached hold (``Lock.detach``) shows as such in ``manage.py locks`` and
on the dashboard until it is adopted: who detached it, since when."""

from __future__ import annotations

import json
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from django_redislock import Lock
from django_redislock.context import describe_holder

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django_redislock/heldlock/"


def locks(*args: str) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out)
    return out.getvalue()


def detached(name: str) -> str:
    with describe_holder("POST /export/"), Lock(name, timeout=30) as lock:
        return lock.detach()


def test_the_command_lists_and_inspects_a_detached_hold_until_it_is_adopted() -> None:
    before = time.time()
    ticket = detached("export:1")
    (listed,) = json.loads(locks("--json"))
    (holder,) = listed["holders"]
    assert holder["holder"].endswith(" | POST /export/") and "\x1e" not in holder["holder"]
    assert before - 1 <= holder["detached_since"] <= time.time() + 1
    table = locks()
    assert "POST /export/ detached (since " in table and " UTC)" in table
    assert "detached (since " in locks("inspect", "export:1")
    with describe_holder("tasks.export"), Lock.adopt(ticket):
        (listed,) = json.loads(locks("--json"))
        (holder,) = listed["holders"]
        assert holder["detached_since"] is None
        assert holder["holder"].endswith(" | tasks.export")
        assert "detached" not in locks() and "detached" not in locks("inspect", "export:1")


def rows(client: Client) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in client.get(DASHBOARD + "data/").json()["results"]}


def test_the_dashboard_marks_a_detached_hold_until_it_is_adopted(admin_client: Client) -> None:
    ticket = detached("export:2")
    with Lock("plain"):
        found = rows(admin_client)
        assert found["plain"]["detached"] is False
        assert found["plain"]["holders"][0]["detached_for"] is None
    row = found["export:2"]
    assert row["detached"] is True
    (holder,) = row["holders"]
    assert 0 <= holder["detached_for"] < 5 and holder["runs"] == "POST /export/"
    body = admin_client.get(DASHBOARD).content.decode()
    assert body.count('class="redislock-badge detached"') == 1
    page = admin_client.get(row["detail_url"])  # the name's own page
    assert page.status_code == 200
    assert 'class="redislock-badge detached"' in page.content.decode()
    adopted = Lock.adopt(ticket)
    assert rows(admin_client)["export:2"]["detached"] is False
    assert 'redislock-badge detached"' not in admin_client.get(DASHBOARD).content.decode()
    adopted.release()
