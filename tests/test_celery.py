"""The Celery recipes of ``docs/celery.md``, with a real worker process.

The broker is a database of the suite's own redis-server; the worker runs
two processes (prefork), so two tasks really run at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis

from django_redislock import Lock, LockTimeout
from django_redislock import signals as lock_signals
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture

pytest.importorskip("celery")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("real_redis")]

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "celery.md"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    log = (tmp_path_factory.mktemp("celery") / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "worker",
         "--pool=prefork", "--concurrency=2", "--without-heartbeat", "--without-mingle",
         "--without-gossip", "--loglevel=WARNING", "-Q", "redislock-tests"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
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
        log.close()


@pytest.fixture
def tasks(worker: subprocess.Popen[str], redis_client: redis.Redis) -> object:
    from tests.support import celery_app

    celery_app.ping.delay()
    assert redis_client.blpop(["celery:ready"], timeout=60), "the worker did not start"
    return celery_app


def done(client: redis.Redis, count: int) -> list[str]:
    seen = []
    for _ in range(count):
        item = client.blpop(["celery:done"], timeout=30)
        assert item is not None, f"only {seen} finished"
        seen.append(item[1].decode())
    return seen


def test_one_task_per_name_at_a_time_across_workers(
    tasks: object, redis_client: redis.Redis
) -> None:
    for _ in range(4):
        tasks.import_feed.delay("prices")  # type: ignore[attr-defined]
    tasks.import_feed.delay("stock")  # type: ignore[attr-defined]
    assert sorted(done(redis_client, 5)) == ["prices"] * 4 + ["stock"]
    concurrency = [int(n) for n in redis_client.lrange("celery:concurrency:prices", 0, -1)]
    assert concurrency == [1, 1, 1, 1]  # never two imports of one feed at once


def test_skip_when_already_running(
    tasks: object, redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    holder = Lock("report:monday")
    other_thread(holder.acquire)  # a run in progress elsewhere
    tasks.report_once.delay("monday")  # type: ignore[attr-defined]
    assert done(redis_client, 1) == ["skipped monday"]
    other_thread(holder.release)
    tasks.report_once.delay("monday")  # type: ignore[attr-defined]
    assert done(redis_client, 1) == ["built monday"]


def test_retry_later_with_a_countdown_from_retry_after(
    tasks: object, redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    holder = Lock("report:tuesday", timeout=1.5, auto_renew=False)  # a holder that dies
    other_thread(holder.acquire)
    tasks.report_later.delay("tuesday")  # type: ignore[attr-defined]
    first, second = done(redis_client, 2)
    assert first in ("retry tuesday in 1", "retry tuesday in 2")  # the lease's rest
    assert second == "built tuesday"  # retried once the lease ran out


def celery_recipes() -> dict[str, Any]:
    """The page's Celery blocks, in one module as a project's ``tasks.py``."""
    text = PAGE.read_text(encoding="utf-8").split("## Django's own tasks")[0]
    namespace: dict[str, Any] = {"__name__": "shop.tasks"}
    for code in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


def test_the_pages_own_blocks_lock_skip_and_retry(other_thread: OtherThread) -> None:
    """The blocks of the page themselves (the worker above runs copies that
    report what they do), each task called in this process as a worker calls it."""
    from celery.exceptions import Retry

    tasks = celery_recipes()
    with capture(lock_signals.lock_acquired) as calls:
        tasks["import_feed"]("prices")
    assert [call["name"] for call in calls] == ["import:prices"]  # named after the work

    holder = Lock("report:monday", timeout=5, auto_renew=False)  # a run in progress
    other_thread(holder.acquire)
    try:
        assert tasks["nightly_report"]("monday") == "skipped"
        later = tasks["nightly_report_later"]
        with mock.patch.object(later, "retry", return_value=Retry()) as retry:
            with pytest.raises(Retry):
                later("monday")
        assert 1 <= retry.call_args.kwargs["countdown"] <= 5  # the holder's lease left
        assert isinstance(retry.call_args.kwargs["exc"], LockTimeout)
    finally:
        other_thread(holder.release)
    assert tasks["nightly_report"]("monday") is None  # built: the body is "..."


def test_a_view_hands_its_hold_to_a_celery_task(tasks: object, redis_client: redis.Redis) -> None:
    """docs/long-holds.md: the view detaches, the worker adopts, renews,
    releases; the same ticket sent twice is refused the second time."""
    import json

    lock = Lock("export:handed", timeout=10)
    lock.acquire()
    fence = lock.fencing_token
    ticket = lock.detach()
    tasks.export_handed_over.delay(ticket)  # type: ignore[attr-defined]
    item = redis_client.blpop(["celery:handed"], timeout=60)
    assert item is not None, "the task never reported"
    report = json.loads(item[1])
    assert report == {"pid": report["pid"], "fence": fence, "owned": True, "released": True}
    assert report["pid"] != os.getpid()
    tasks.export_handed_over.delay(ticket)  # type: ignore[attr-defined]
    item = redis_client.blpop(["celery:handed"], timeout=60)
    assert item is not None, "the task never reported"
    assert "lease ran out" in json.loads(item[1])["lost"]
