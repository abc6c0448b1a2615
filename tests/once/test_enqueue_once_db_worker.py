"""Enqueue once with Django's tasks framework and a real worker: django-tasks-db's
database backend, ``manage.py db_worker`` in its own process on the test
database (SQLite's file or PostgreSQL's), and OS processes enqueuing the same
key at the same moment (``docs/once.md``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

pytest.importorskip("django.tasks")
pytest.importorskip("django_tasks_db")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_redis"),
]

from django.tasks import TaskResultStatus  # noqa: E402
from django_tasks_db.models import DBTaskResult  # noqa: E402

from tests.support import once_db_tasks as tasks  # noqa: E402
from tests.support.procs import processes, reap, start_one  # noqa: E402

CLAIMS = "*:{once:*}:once"


def start_worker(client: redis.Redis) -> Any:
    proc = start_one(tasks.run_worker)
    assert client.blpop(["once:worker"], timeout=60), "the db_worker never started"
    return proc


def stop_worker(proc: Any) -> None:
    proc.terminate()  # SIGTERM: db_worker stops between tasks
    proc.join(20)
    reap([proc])


@pytest.fixture
def worker(redis_client: redis.Redis) -> Iterator[Any]:
    proc = start_worker(redis_client)
    try:
        yield proc
    finally:
        stop_worker(proc)


def started(client: redis.Redis) -> str:
    item = client.blpop(["once:started"], timeout=60)
    assert item is not None, "no task started"
    return str(item[1].decode())


def wait_for(condition: Callable[[], bool], message: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # polling: a lapse or a row's status has no event to wait on
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def status(result_id: Any) -> str:
    return str(DBTaskResult.objects.values_list("status", flat=True).get(id=result_id))


def finish(client: redis.Redis, key: str, result_id: Any) -> None:
    """Let ``key``'s task finish; back once the worker has stored its result."""
    client.rpush(f"once:go:{key}", "1")
    wait_for(lambda: status(result_id) == TaskResultStatus.SUCCESSFUL, f"{key} never finished")


def claims(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(CLAIMS))


def test_processes_enqueuing_one_key_at_once_queue_one_task_and_run_it_once(
    worker: Any, redis_client: redis.Redis
) -> None:
    enqueuers = 4
    with processes(tasks.enqueue_at_once, [(42,)] * enqueuers):
        for _ in range(enqueuers):
            assert redis_client.blpop(["once:ready"], timeout=60), "an enqueuer never started"
        redis_client.rpush("once:fire", *["1"] * enqueuers)  # all at the same moment
    (row,) = DBTaskResult.objects.filter(task_path=tasks.recalc.module_path)  # queued once
    said = [item.decode() for item in redis_client.lrange("once:enqueued", 0, -1)]
    assert len(said) == enqueuers
    for answer in said:  # the first's result, or refused before its id was recorded
        assert answer in (f"result {row.id}", "refused queued None"), said
    assert said.count(f"result {row.id}") >= 1
    assert started(redis_client) == "recalc:42"
    assert tasks.recalc.enqueue(42).id == str(row.id)  # running: coalesced
    finish(redis_client, "recalc:42", row.id)
    assert int(redis_client.get("once:runs:recalc:42") or 0) == 1
    assert not claims(redis_client)  # released when it ended
    again = tasks.recalc.enqueue(42)  # free again: queued and run anew
    assert again.id != str(row.id)
    assert started(redis_client) == "recalc:42"
    finish(redis_client, "recalc:42", again.id)
    assert int(redis_client.get("once:runs:recalc:42") or 0) == 2


def test_release_at_start_lets_one_queue_while_another_runs(
    worker: Any, redis_client: redis.Redis
) -> None:
    first = tasks.index.enqueue("a")
    assert started(redis_client) == "index:a"
    second = tasks.index.enqueue("a")  # released as it started: a new one is queued
    assert second.id != first.id
    assert tasks.index.enqueue("a").id == second.id  # ...once: the one worker is busy
    assert status(second.id) == TaskResultStatus.READY
    finish(redis_client, "index:a", first.id)
    assert started(redis_client) == "index:a"
    finish(redis_client, "index:a", second.id)
    assert DBTaskResult.objects.filter(task_path=tasks.index.module_path).count() == 2


def test_a_task_that_raises_releases_its_claim(worker: Any, redis_client: redis.Redis) -> None:
    first = tasks.charge.enqueue(7)
    assert started(redis_client) == "charge:7"
    wait_for(lambda: status(first.id) == TaskResultStatus.FAILED, "the task never failed")
    assert "card declined" in tasks.charge.get_result(first.id).errors[0].traceback
    assert not claims(redis_client)  # released as it raised, before its failure was stored
    again = tasks.charge.enqueue(7)
    assert again.id != first.id
    assert started(redis_client) == "charge:7"


def test_a_worker_killed_mid_task_lets_the_claim_lapse_within_its_lease(
    redis_client: redis.Redis,
) -> None:
    doomed = start_worker(redis_client)
    try:
        first = tasks.recalc.enqueue(99)  # lease 2 s, renewed while it runs
        assert started(redis_client) == "recalc:99"
        (claim,) = claims(redis_client)
        until = time.monotonic() + 3  # past a lease: renewed, or it would be gone
        while time.monotonic() < until:
            assert redis_client.exists(claim), "the claim lapsed while its task ran"
            assert 0 < redis_client.pttl(claim) <= 2000  # a lease, not the queued TTL
            time.sleep(0.1)
        assert tasks.recalc.enqueue(99).id == first.id  # still running: coalesced
        doomed.kill()  # SIGKILL mid-task: no release, no more renewals
        doomed.join(10)
        killed_at = time.monotonic()
        wait_for(lambda: not redis_client.exists(claim), "the dead worker's claim never lapsed")
        assert time.monotonic() - killed_at < 2 + 2  # within the lease (and a margin)
    finally:
        reap([doomed])
    assert status(first.id) == TaskResultStatus.RUNNING  # the dead worker's row says so still
    again = tasks.recalc.enqueue(99)  # the key is free again
    assert again.id != first.id
    fresh = start_worker(redis_client)
    try:
        assert started(redis_client) == "recalc:99"
        finish(redis_client, "recalc:99", again.id)
    finally:
        stop_worker(fresh)
