"""Enqueue once with Django's tasks framework: real processes enqueuing with
the immediate backend (which runs the task in the enqueuing process, so a
process killed mid-task is a worker killed mid-task), and a backend that
keeps results (the dummy backend) for the coalesced handle."""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

pytest.importorskip("django.tasks")
pytestmark = pytest.mark.usefixtures("real_redis")

from django.tasks import task  # noqa: E402

from django_redislock.once.claims import AlreadyEnqueued  # noqa: E402
from django_redislock.once.django_tasks import OnceTask, enqueue_once  # noqa: E402
from tests.support import once_django_tasks as tasks  # noqa: E402
from tests.support.procs import processes, reap, start_one  # noqa: E402

CLAIMS = "*:{once:*}:once"
DUMMY = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}


def started(client: redis.Redis) -> str:
    item = client.blpop(["once:started"], timeout=60)
    assert item is not None, "no task started"
    return str(item[1].decode())


def enqueued(client: redis.Redis) -> str:
    item = client.blpop(["once:enqueued"], timeout=60)
    assert item is not None, "no enqueue reported"
    return str(item[1].decode())


@pytest.mark.slow
def test_a_second_process_is_refused_while_the_first_runs_then_runs(
    redis_client: redis.Redis,
) -> None:
    first = start_one(tasks.enqueue_recalc, 42)
    try:
        assert started(redis_client) == "recalc:42"
        with processes(tasks.enqueue_recalc, [(42,)]):
            pass
        assert enqueued(redis_client) == "refused running"
        redis_client.rpush("once:go:recalc:42", "1")
        assert enqueued(redis_client) == "SUCCESSFUL recalculated 42"
        first.join(30)
    finally:
        reap([first])
    assert not list(redis_client.scan_iter(CLAIMS))  # released when it ended
    redis_client.rpush("once:go:recalc:42", "1")
    with processes(tasks.enqueue_recalc, [(42,)]):
        pass
    assert enqueued(redis_client) == "SUCCESSFUL recalculated 42"
    assert int(redis_client.get("once:runs:recalc:42") or 0) == 2


@pytest.mark.slow
def test_a_process_killed_mid_task_lets_its_claim_lapse(redis_client: redis.Redis) -> None:
    doomed = start_one(tasks.enqueue_recalc, 43)
    try:
        assert started(redis_client) == "recalc:43"
        (claim,) = redis_client.scan_iter(CLAIMS)
        assert 0 < redis_client.pttl(claim) <= 2000  # leased: the run holds it
        doomed.kill()
        doomed.join(10)
    finally:
        reap([doomed])
    deadline = time.monotonic() + 30
    while redis_client.exists(claim):  # polling Redis: a lapse has no event to wait on
        assert time.monotonic() < deadline, "the dead process's claim never lapsed"
        time.sleep(0.02)
    redis_client.rpush("once:go:recalc:43", "1")
    assert tasks.recalc.enqueue(43).return_value == "recalculated 43"


def test_a_backend_that_keeps_results_hands_back_the_queued_one(
    redis_client: redis.Redis,
) -> None:
    with override_settings(TASKS=DUMMY):
        first = tasks.mail.enqueue(1)
        assert tasks.mail.enqueue(1).id == first.id  # coalesced: the same result
        assert tasks.mail.enqueue(2).id != first.id  # another key
        with pytest.raises(AlreadyEnqueued) as refused:
            tasks.mail_or_raise.enqueue(1)  # the same key, on_duplicate="raise"
    assert refused.value.task_id == first.id and refused.value.state == "queued"
    assert len(list(redis_client.scan_iter(CLAIMS))) == 2


def test_the_task_survives_pickling_as_a_worker_backend_sends_it() -> None:
    copy = pickle.loads(pickle.dumps(tasks.recalc))
    assert isinstance(copy, OnceTask) and copy.once == tasks.recalc.once
    assert copy.func is tasks.recalc.func


def plain(order_id: int) -> None: ...


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"release": "later"}, ValueError),
        ({"on_duplicate": "drop"}, ValueError),
        ({"lease": 0}, ValueError),
        ({"queued_ttl": None}, TypeError),
        ({"using": ""}, TypeError),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        enqueue_once("recalc:<order_id>", **options)


def test_a_placeholder_no_argument_fills_fails_at_decoration() -> None:
    with pytest.raises(ImproperlyConfigured, match="<user_id>"):
        enqueue_once("mail:<user_id>")(task(tasks.recalc.func))


def test_it_goes_above_task() -> None:
    with pytest.raises(TypeError, match="above @task"):
        enqueue_once("recalc:<order_id>")(plain)  # type: ignore[arg-type]


def test_a_send_that_fails_leaves_no_claim(redis_client: redis.Redis) -> None:
    from unittest import mock

    with (
        override_settings(TASKS=DUMMY),
        mock.patch("django.tasks.Task.enqueue", side_effect=RuntimeError("broker down")),
        pytest.raises(RuntimeError, match="broker down"),
    ):
        tasks.mail.enqueue(3)
    assert not list(redis_client.scan_iter(CLAIMS))  # nothing half-done


def test_redis_unreachable_at_enqueue_sends_nothing() -> None:
    from django.tasks import default_task_backend

    from django_redislock import LockBackendError
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    down = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(TASKS=DUMMY):
        with override_settings(CACHES=down), pytest.raises(LockBackendError):
            tasks.mail.enqueue(4)
        assert default_task_backend.results == []  # nothing was sent
