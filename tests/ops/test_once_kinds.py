"""``manage.py locks`` and the dashboard show idempotency keys (in flight and
stored, with their age) and enqueue claims, and clear one."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import Client

from django_redislock.once.attempts import Attempt
from django_redislock.once.claims import Claims, Once
from django_redislock.once.store import Snapshot, Store

DASHBOARD = "/admin/django_redislock/heldlock/"


def recalc(order_id: int) -> None: ...


@pytest.fixture
def once_records() -> dict[str, str]:
    """One stored response, one request in flight and one queued claim."""
    records = Store(None, 60)
    done = Attempt("idempotency:done", "f" * 64, "tap-1", "", "POST", "/pay/")
    records.begin(done, "owner-1")
    records.settle(done, "owner-1", Snapshot(201, "Created", [], b"{}"))
    running = Attempt("idempotency:inflight", "f" * 64, "tap-2", "7", "POST", "/pay/")
    records.begin(running, "owner-2")
    claims = Claims(Once("recalc:<order_id>"), recalc, "test")
    assert claims.claim("once:recalc:42", "token-1", "task-42", "shop.recalc") is None
    return {"running": running.name, "claim": "once:recalc:42"}


def listed(*args: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("locks", "list", "--json", *args, stdout=out)
    return list(json.loads(out.getvalue()))


def test_locks_lists_keys_in_flight_stored_and_claims(once_records: dict[str, str]) -> None:
    rows = listed("--kind", "idempotency", "--kind", "once")
    by_kind: dict[str, list[str]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).extend(h["holder"] for h in row["holders"])
    assert sorted(by_kind["idempotency"]) == [
        "anonymous | stored 201: POST /pay/ key 'tap-1', 0s old",
        "user 7 | in flight: POST /pay/ key 'tap-2', 0s old",
    ]
    assert by_kind["once"] == ["id task-42 | queued: task shop.recalc, 0s old"]
    text = StringIO()
    call_command("locks", "list", "--kind", "idempotency", stdout=text)
    assert "2 held." in text.getvalue()  # the count


def test_locks_inspect_shows_state_and_age(once_records: dict[str, str]) -> None:
    out = StringIO()
    call_command("locks", "inspect", once_records["claim"], stdout=out)
    assert "state: queued" in out.getvalue() and "age: " in out.getvalue()


def test_locks_clear_frees_a_claim_and_a_record(
    once_records: dict[str, str], redis_client: redis.Redis
) -> None:
    out = StringIO()
    call_command("locks", "clear", once_records["claim"], once_records["running"],
                 "--noinput", stdout=out)  # fmt: skip
    assert "Released once once:recalc:42" in out.getvalue()
    assert "Released idempotency idempotency:inflight" in out.getvalue()
    assert [row["kind"] for row in listed("--kind", "once")] == []
    assert len(listed("--kind", "idempotency")) == 1  # the stored one stays


@pytest.mark.django_db
def test_the_dashboard_lists_them(once_records: dict[str, str], admin_client: Client) -> None:
    body = admin_client.get(DASHBOARD).content.decode()
    assert once_records["claim"] in body and once_records["running"] in body
    assert "queued: task shop.recalc" in body and "in flight: POST /pay/" in body
