"""Enqueue once with Celery (``OnceTask``): real workers and a broker on the
suite's own redis-server, including a worker killed mid-task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

pytest.importorskip("celery")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("real_redis")]

ROOT = Path(__file__).resolve().parent.parent.parent
CLAIMS = "*:{once:*}:once"


#: The queue of the worker the kill test starts (and kills) on its own.
SOLO_QUEUE = "redislock-once-solo"


@contextmanager
def celery_worker(log: Path, *, pool: str, queue: str) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.celery_once_app", "worker",
             f"--pool={pool}", "--concurrency=2", "--without-heartbeat", "--without-mingle",
             "--without-gossip", "--loglevel=WARNING", "-Q", queue],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def prefork(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    """A worker of two processes: two tasks run at once, a third stays queued."""
    log = tmp_path_factory.mktemp("celery-once") / "worker.log"
    with celery_worker(log, pool="prefork", queue="redislock-once-tests") as proc:
        yield proc


@pytest.fixture
def worker(prefork: subprocess.Popen[str], redis_client: redis.Redis) -> Any:
    from tests.support import celery_once_app

    celery_once_app.ping.delay()
    assert redis_client.blpop(["once:ready"], timeout=60), "the worker did not start"
    return celery_once_app


def started(client: redis.Redis) -> str:
    item = client.blpop(["once:started"], timeout=30)
    assert item is not None, "no task started"
    return str(item[1].decode())


def finish(client: redis.Redis, key: str) -> None:
    """Let ``key``'s task finish; back once it has counted its run."""
    client.rpush(f"once:go:{key}", "1")
    wait_for(lambda: client.get(f"once:runs:{key}") is not None, f"{key} never finished")


def claims(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(CLAIMS))


def test_a_second_enqueue_while_queued_or_running_returns_the_first(
    worker: Any, redis_client: redis.Redis
) -> None:
    first = worker.recalc.delay(42)
    assert started(redis_client) == "recalc:42"
    again = worker.recalc.delay(42)  # running: coalesced
    assert again.id == first.id
    other = worker.recalc.delay(7)  # another key
    assert other.id != first.id
    assert started(redis_client) == "recalc:7"
    # both worker processes busy: a third key stays queued
    queued = worker.recalc.delay(8)
    assert worker.recalc.delay(8).id == queued.id
    finish(redis_client, "recalc:42")
    finish(redis_client, "recalc:7")
    assert started(redis_client) == "recalc:8"
    finish(redis_client, "recalc:8")
    assert [int(redis_client.get(f"once:runs:recalc:{n}") or 0) for n in (42, 7, 8)] == [1, 1, 1]
    wait_for(lambda: not claims(redis_client), "the claims were not released at the end")
    assert worker.recalc.delay(42).id != first.id  # released when it ended: runs again
    assert started(redis_client) == "recalc:42"
    redis_client.rpush("once:go:recalc:42", "1")


def test_on_duplicate_raise_names_the_task_that_has_the_key(
    worker: Any, redis_client: redis.Redis
) -> None:
    from django_redislock.once.claims import AlreadyEnqueued

    first = worker.mail.delay(1)
    assert started(redis_client) == "mail:1"
    with pytest.raises(AlreadyEnqueued) as refused:
        worker.mail.delay(1)
    assert refused.value.task_id == first.id and refused.value.state == "running"
    redis_client.rpush("once:go:mail:1", "1")


def test_release_at_start_lets_one_queue_while_another_runs(
    worker: Any, redis_client: redis.Redis
) -> None:
    worker.recalc.delay(11)  # keeps the worker's other process busy...
    assert started(redis_client) == "recalc:11"
    first = worker.index.delay("a")
    assert started(redis_client) == "index:a"
    second = worker.index.delay("a")  # released as it started: a new one is queued
    assert second.id != first.id
    assert worker.index.delay("a").id == second.id  # ...once: it cannot start yet
    redis_client.rpush("once:go:index:a", "1", "1")
    assert started(redis_client) == "index:a"
    redis_client.rpush("once:go:recalc:11", "1")


def wait_for(condition: Callable[[], bool], message: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # polling Redis: a lapse or a release has no event to wait on
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def test_a_killed_worker_lets_the_claim_lapse_and_a_live_one_keeps_it(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    from tests.support import celery_once_app as tasks

    with celery_worker(tmp_path / "solo.log", pool="solo", queue=SOLO_QUEUE) as proc:
        tasks.ping.apply_async(queue=SOLO_QUEUE)
        assert redis_client.blpop(["once:ready"], timeout=60), "the worker did not start"
        first = tasks.recalc.apply_async((99,), queue=SOLO_QUEUE)  # lease 2 s, renewed
        assert started(redis_client) == "recalc:99"
        (claim,) = claims(redis_client)
        until = time.monotonic() + 4  # two leases: renewed, or it would be gone
        while time.monotonic() < until:
            assert redis_client.exists(claim), "the claim lapsed while its task ran"
            assert 0 < redis_client.pttl(claim) <= 2000  # a lease, not the queued TTL
            time.sleep(0.1)
        assert tasks.recalc.apply_async((99,), queue=SOLO_QUEUE).id == first.id
        os.kill(proc.pid, signal.SIGKILL)  # mid-task: no release, no more renewals
        proc.wait(10)
        wait_for(lambda: not redis_client.exists(claim), "the dead worker's claim never lapsed")
        again = tasks.recalc.apply_async((99,), queue=SOLO_QUEUE)
        assert again.id != first.id  # the key is free again


def test_a_send_that_fails_leaves_no_claim(redis_client: redis.Redis) -> None:
    from unittest import mock

    from tests.support import celery_once_app as tasks

    with (
        mock.patch("celery.app.task.Task.apply_async", side_effect=RuntimeError("broker down")),
        pytest.raises(RuntimeError, match="broker down"),
    ):
        tasks.recalc.delay(5)
    assert not claims(redis_client)  # nothing half-done


@pytest.mark.parametrize(
    ("once", "error"),
    [
        (None, TypeError),
        ({"keys": ["order_id"]}, TypeError),  # celery-once's spelling
        ({"key": "recalc:<order_id>", "graceful": True}, TypeError),
        ({"key": "recalc:<nope>"}, ImproperlyConfigured),
        ({"key": "recalc:<order_id>", "release": "never"}, ValueError),
    ],
)
def test_bad_once_options_fail_when_celery_makes_the_task(
    once: Any, error: type[Exception]
) -> None:
    from celery import Celery

    from django_redislock.once.celery import OnceTask

    def recalc(order_id: int) -> None: ...

    app = Celery("bad-options", set_as_current=False)  # never shared with other apps
    task = app.task(base=OnceTask, once=once, shared=False)(recalc)
    with pytest.raises(error):
        task.name  # noqa: B018 (Celery makes a task when it is first used)


#: The queue a retry is sent to: no worker consumes it until the test starts one.
PARKED_QUEUE = "redislock-once-parked"


def test_a_retry_keeps_the_claim_so_the_retried_task_is_still_the_one_enqueued(
    worker: Any, tmp_path: Path, redis_client: redis.Redis
) -> None:
    first = worker.flaky.delay(5, PARKED_QUEUE)
    assert started(redis_client) == "flaky:5"
    redis_client.rpush("once:go:flaky:5", "1")  # its first try calls self.retry()
    item = redis_client.blpop(["once:ended"], timeout=30)
    assert item is not None and item[1].decode() == f"flaky {first.id} RETRY"
    # the first run ended; its retry waits in a queue no worker consumes yet
    (claim,) = claims(redis_client)
    assert redis_client.hget(claim, "state") == b"queued"
    assert redis_client.hget(claim, "id") == first.id.encode()
    assert redis_client.pttl(claim) > 3_000_000  # queued_ttl (1 h), not a run's lease
    assert worker.flaky.delay(5, PARKED_QUEUE).id == first.id  # the retry counts
    with celery_worker(tmp_path / "parked.log", pool="solo", queue=PARKED_QUEUE):
        assert started(redis_client) == "flaky:5"  # the retry runs
        assert worker.flaky.delay(5, PARKED_QUEUE).id == first.id  # running: coalesced
        finish(redis_client, "flaky:5")
        wait_for(lambda: not claims(redis_client), "the retry's claim was not released")
    assert int(redis_client.get("once:runs:flaky:5") or 0) == 1
    again = worker.flaky.delay(5, PARKED_QUEUE)  # free again: a new task
    assert again.id != first.id
    assert started(redis_client) == "flaky:5"
    redis_client.rpush("once:go:flaky:5", "1")  # its retry stays parked


def test_a_retrys_delay_is_its_countdown_or_its_eta() -> None:
    from datetime import datetime, timedelta, timezone

    from django_redislock.once.celery import _delay

    assert _delay({"countdown": 30, "eta": None}) == 30
    soon = datetime.now(timezone.utc) + timedelta(seconds=60)
    assert 50 < _delay({"countdown": None, "eta": soon}) <= 60
    assert 50 < _delay({"eta": soon.replace(tzinfo=None)}) <= 60  # naive: UTC, as Celery has it
    assert _delay({}) == 0
