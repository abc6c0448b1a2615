"""Leaderships as operators see them: ``manage.py locks`` and the admin dashboard.

A leadership is the lock ``leader:<name>`` (kind ``leadership``): the holder
is the leader, ``since`` its election, the queued waiters its standbys.
"""

from __future__ import annotations

import io
import json
import queue
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_redislock import Leadership, Lock
from django_redislock.ops import inspection

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django_redislock/heldlock/"
QUEUE = "redislock:{leader:beat}:queue"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("locks", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def election(redis_client: redis.Redis) -> Iterator[tuple[Leadership, queue.SimpleQueue[str]]]:
    """``beat`` led from this thread, with two standbys campaigning on threads of their own."""
    leader = Leadership("beat", timeout=3)
    assert leader.campaign()
    elected: queue.SimpleQueue[str] = queue.SimpleQueue()
    standbys = [
        Leadership("beat", timeout=3, on_elected=lambda ld, n=n: elected.put(n)) for n in "ab"
    ]
    threads = [
        threading.Thread(target=s.campaign, name=f"standby-{n}")
        for s, n in zip(standbys, "ab", strict=True)
    ]
    for queued, thread in enumerate(threads, 1):  # one after the other: a is first in line
        thread.start()
        deadline = time.monotonic() + 20
        while redis_client.zcard(QUEUE) < queued:
            assert time.monotonic() < deadline, "the standby never queued"
            time.sleep(0.01)
    yield leader, elected
    leader.resign()
    for standby in standbys:
        standby.resign()
    for thread in threads:
        thread.join(30)
    for standby in standbys:
        standby.resign()  # the one elected after the first resign


def test_locks_lists_a_leadership_as_such_with_its_standbys(
    election: tuple[Leadership, queue.SimpleQueue[str]],
) -> None:
    other = Lock("beat")  # a lock of the same bare name is another thing
    assert other.acquire()
    held = {(i.name, i.kind): i for i in inspection.list_held(*_connect())}
    assert set(held) == {("leader:beat", "leadership"), ("beat", "lock")}
    info = held["leader:beat", "leadership"]
    assert info.waiters == 2
    [row] = json.loads(run("list", "--json", "--kind", "leadership"))
    assert (row["name"], row["kind"], row["waiters"]) == ("leader:beat", "leadership", 2)
    assert row["fencing_token"] == election[0].fencing_token
    assert [r["kind"] for r in json.loads(run("list", "--json", "--kind", "lock"))] == ["lock"]
    text = run("inspect", "leader:beat")
    assert "leadership: led by " in text and ":MainThread, 2 standby(s) waiting" in text
    assert "since: " in text
    other.release()


def test_the_dashboard_shows_the_leader_and_the_standbys_in_line(
    election: tuple[Leadership, queue.SimpleQueue[str]],
) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    [row] = client.get(DASHBOARD + "data/").json()["results"]
    assert (row["name"], row["kind"], row["waiters"]) == ("leader:beat", "leadership", 2)
    assert row["holders"][0]["thread"] == "MainThread"
    assert 0 <= row["held_for"] < 30
    assert [q["thread"] for q in row["queue"]] == ["standby-a", "standby-b"]
    body = client.get(DASHBOARD).content.decode()
    assert '<span class="quiet leader">leader</span>' in body
    assert '<span class="quiet standbys">standing by</span>' in body
    detail = client.get(row["detail_url"]).content.decode()
    assert "<caption>Leader</caption>" in detail and "<dt>Standbys</dt>" in detail


def test_clearing_a_leadership_steps_its_leader_down_and_elects_the_next_standby(
    election: tuple[Leadership, queue.SimpleQueue[str]],
) -> None:
    leader, elected = election
    run("clear", "leader:beat", "--noinput")
    assert elected.get(timeout=20) == "a"  # the first in line
    assert leader.wait_revoked(timeout=30)  # its next renewal found the lease gone
    assert not leader.is_leader


def _connect() -> tuple[object, str]:
    from django_redislock.ops.common import connect

    return connect()
