from __future__ import annotations

import io
import json
import threading
import time

import pytest
import redis
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

from django_redislock import Lock, LockLostError
from django_redislock.inspection import stats
from tests.holders import OtherThread

STATS_KEY = "redislock:{%s}:stats"


def counters(client: redis.Redis, name: str) -> dict[str, int]:
    return stats(client, "redislock", [name])[0]


def test_acquisitions_are_counted_in_the_acquire_script(redis_client: redis.Redis) -> None:
    lock = Lock("sku:1")
    for _ in range(3):
        with lock:
            with lock:  # nesting is not another acquisition
                pass
    assert counters(redis_client, "sku:1") == {"acquired": 3}
    ttl = redis_client.pttl(STATS_KEY % "sku:1")
    assert 3_600_000 - 60_000 < ttl <= 3_600_000  # STATS = True: an hour


def test_contention_and_wait_time(redis_client: redis.Redis, other_thread: OtherThread) -> None:
    holder = Lock("hot", auto_renew=False)
    holder.acquire()
    assert not other_thread(Lock("hot").acquire, blocking=False)
    queued = threading.Event()
    done = threading.Event()

    def wait() -> None:
        lock = Lock("hot", blocking_timeout=30)
        queued.set()
        assert lock.acquire()
        lock.release()
        done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    queued.wait(5)
    client = redis_client
    deadline = time.monotonic() + 10
    while not client.exists("redislock:{hot}:queue"):  # the waiter has queued
        assert time.monotonic() < deadline, "the waiter never queued"
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)  # lets the waiter accumulate measurable wait time
    holder.release()
    assert done.wait(10)
    thread.join(5)
    found = counters(redis_client, "hot")
    # the refused try and the waiter's first refusal; the waiter's re-checks are not counted again
    assert found["contended"] == 2
    assert found["acquired"] == 2
    assert found["wait_ms"] >= 150


def test_lost_leases_are_counted(redis_client: redis.Redis) -> None:
    lock = Lock("gone", auto_renew=False)
    lock.acquire()
    redis_client.delete("redislock:{gone}:lock")
    with pytest.raises(LockLostError):
        lock.release()
    assert counters(redis_client, "gone") == {"acquired": 1, "lost": 1}


def test_counting_off_writes_nothing(redis_client: redis.Redis, other_thread: OtherThread) -> None:
    with override_settings(REDISLOCK={"STATS": False}):
        holder = Lock("quiet", auto_renew=False)
        holder.acquire()
        assert not other_thread(Lock("quiet").acquire, blocking=False)
        redis_client.delete("redislock:{quiet}:lock")
        with pytest.raises(LockLostError):
            holder.release()
    assert not redis_client.exists(STATS_KEY % "quiet")


@pytest.mark.parametrize(("enabled", "per_acquire"), [(True, 1), (False, 0)])
def test_cost_is_one_command_inside_the_script(
    redis_client: redis.Redis, enabled: bool, per_acquire: int
) -> None:
    lock = Lock("cost", auto_renew=False)
    with override_settings(REDISLOCK={"STATS": enabled}):
        lock.acquire()
        lock.release()  # scripts loaded
        redis_client.config_resetstat()
        for _ in range(20):
            lock.acquire()
            lock.release()
    found = redis_client.info("commandstats")
    assert found.get("cmdstat_hincrby", {}).get("calls", 0) == 20 * per_acquire
    # the TTL is refreshed on creation and every 64th update, not per acquire
    assert found.get("cmdstat_pexpire", {}).get("calls", 0) == 0
    if enabled:
        assert redis_client.pttl(STATS_KEY % "cost") > 0
    # still one round trip per acquire and per release
    assert found["cmdstat_evalsha"]["calls"] == 40


def test_inspect_and_json_show_counters() -> None:
    with Lock("report"):
        out = io.StringIO()
        call_command("locks", "inspect", "report", stdout=out)
        data = io.StringIO()
        call_command("locks", "inspect", "report", "--json", stdout=data)
    assert "counters: acquired=1, contended=0, lost=0, wait_ms=0" in out.getvalue()
    assert json.loads(data.getvalue())["counters"] == {"acquired": 1}


@pytest.mark.django_db
def test_dashboard_shows_counters(admin_client: object) -> None:
    from django.test import Client

    assert isinstance(admin_client, Client)
    with Lock("sku:9"):
        row = admin_client.get("/admin/django_redislock/heldlock/data/").json()["results"][0]
        body = admin_client.get("/admin/django_redislock/heldlock/").content.decode()
    assert row["counters"] == {"acquired": 1}
    assert "<dt>acquired</dt><dd>1</dd><dt>contended</dt><dd>0</dd>" in body


@pytest.mark.parametrize("value", ["yes", 0, -5, float("nan")])
def test_setting_is_checked(value: object) -> None:
    with override_settings(REDISLOCK={"STATS": value}):
        errors = [e for e in run_checks() if e.id == "django_redislock.E012"]
    assert len(errors) == 1
    assert "REDISLOCK['STATS'] must be True, False or a positive number of seconds" in (
        errors[0].msg
    )


def test_stats_seconds_set_how_long_idle_counters_are_kept(redis_client: redis.Redis) -> None:
    with override_settings(REDISLOCK={"STATS": 5}), Lock("brief"):
        pass
    assert 0 < redis_client.pttl(STATS_KEY % "brief") <= 5000
