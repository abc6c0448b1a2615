"""``@require_slot``: at most N calls at once per key, for views and functions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings

from django_redislock import LockBackendError, LockTimeout, Semaphore, require_slot
from django_redislock.holds.estimates import slot_retry_after
from tests.support import servers, slot_workers
from tests.support.gauge import Gauge
from tests.support.procs import CTX, processes, queued_in_turn


@pytest.fixture(autouse=True)
def _views() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.slot_views"):
        yield


@pytest.fixture
def full() -> Iterator[Semaphore]:
    """Both slots of ``export:42`` taken (by this thread, as two holders would)."""
    sem = Semaphore("export:42", 2, timeout=20)
    assert sem.acquire() and sem.acquire()
    yield sem
    sem.release()
    sem.release()


@pytest.fixture
def redis_down() -> Iterator[None]:
    with servers.redis_down():
        yield


# Views: the slot is held while the view runs, 429 when none frees ----------------


@pytest.mark.parametrize("prefix", ["export", "direct", "decorated", "async"])
def test_the_view_runs_in_one_of_the_keys_slots(prefix: str) -> None:
    response = Client().get(f"/{prefix}/42/")
    assert response.status_code == 200
    assert response.json() == {"name": "export:42", "holders": 1}
    assert Semaphore("export:42", 2).holders() == []


def test_a_second_caller_gets_the_second_slot() -> None:
    sem = Semaphore("export:42", 2, timeout=20)
    with sem:
        assert Client().get("/export/42/").json()["holders"] == 2


@pytest.mark.parametrize("prefix", ["export", "direct", "decorated", "async"])
def test_no_free_slot_answers_429_with_retry_after(full: Semaphore, prefix: str) -> None:
    response = Client().get(f"/{prefix}/42/")
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 20
    assert response.content == b"Too many requests for export:42 at once; try again shortly.\n"
    assert Client().get(f"/{prefix}/43/").status_code == 200  # another key has its own slots


def test_retry_after_is_the_semaphores_hint_not_the_default_lease() -> None:
    sem = Semaphore("export:42", 2, timeout=3, auto_renew=False)
    assert sem.acquire() and sem.acquire()
    try:
        assert 1 <= int(Client().get("/export/42/")["Retry-After"]) <= 3
    finally:
        sem.release()
        sem.release()


@pytest.mark.parametrize("prefix", ["export", "async"])
def test_retry_after_comes_from_what_the_slots_calls_take_not_the_lease(prefix: str) -> None:
    """A 1 s view under the default 30 s lease answered ``Retry-After: 30``:
    the hint was the earliest permit's lease. Now it is the key's ended calls'
    average hold (here a few ms: 1 s, the least), the lease only when nothing
    is known (a key with no ended call yet)."""
    for _ in range(3):  # calls that end: their holds are counted
        assert Client().get(f"/{prefix}/42/").status_code == 200
    for key in ("export:42", "export:44"):  # 44: never run, no history
        sem = Semaphore(key, 2, timeout=60, auto_renew=False)
        assert sem.acquire() and sem.acquire()
        try:
            response = Client().get(f"/{prefix}/{key.split(':')[1]}/")
        finally:
            sem.release()
            sem.release()
        assert response.status_code == 429
        if key == "export:42":
            assert response["Retry-After"] == "1", response["Retry-After"]
        else:
            assert 50 <= int(response["Retry-After"]) <= 60, response["Retry-After"]


def test_retry_after_grows_with_the_callers_queued_ahead() -> None:
    from django_redislock.backend import client as backend
    from django_redislock.holds import counters

    client = backend.get_client("default")
    stats = backend.key(backend.namespace("default", "redislock"), "x", "stats")
    queue = backend.key(backend.namespace("default", "redislock"), "x", "sem:queue")
    counters.held(client, stats.encode(), 60_000, "x", 2.0)  # one call that held 2 s
    refused = LockTimeout("busy", name="x", retry_after=50.0)
    assert slot_retry_after(refused, timeout=None, limit=2) == 2
    client.zadd(queue, {"w1": 1, "w2": 2, "w3": 3})  # three waiting ahead, two slots
    assert slot_retry_after(refused, timeout=None, limit=2) == 4
    assert slot_retry_after(LockTimeout("busy", name="x", retry_after=3.0), timeout=None) == 3


def test_retry_after_without_a_hint_is_the_lease_rounded_up_and_at_least_1() -> None:
    def refused(hint: float | None) -> LockTimeout:
        return LockTimeout("busy", name="x", retry_after=hint)

    assert slot_retry_after(refused(2.1), timeout=None) == 3
    assert slot_retry_after(refused(0.01), timeout=None) == 1
    assert slot_retry_after(refused(None), timeout=7.5) == 8
    with override_settings(REDISLOCK={"TIMEOUT": 12}):
        assert slot_retry_after(refused(None), timeout=None) == 12


def test_on_contention_applies_as_for_require_lock(full: Semaphore) -> None:
    response = Client().get("/export-503/42/")
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1


def test_the_slot_is_given_back_when_the_view_raises() -> None:
    with pytest.raises(RuntimeError, match="the view failed"):
        Client(raise_request_exception=True).get("/boom/42/")
    assert Semaphore("export:42", 2).holders() == []


@pytest.mark.django_db(transaction=True)
def test_the_slot_ends_with_the_view_even_inside_a_transaction() -> None:
    """A slot limits load; it does not guard writes: not handed to the transaction."""
    from django.db import transaction

    @require_slot("job:<n>", limit=1, blocking_timeout=0)
    def job(n: int) -> None:
        pass

    with transaction.atomic():
        job(1)
        assert Semaphore("job:1", 1).holders() == []


def test_drf_views_get_drf_json_for_429_and_503(full: Semaphore) -> None:
    pytest.importorskip("rest_framework")
    with override_settings(ROOT_URLCONF="tests.support.slot_drf_views"):
        response = Client().get("/export/42/")
        assert response.status_code == 429
        assert response["Content-Type"] == "application/json"
        assert response.json() == {
            "detail": "Too many requests for export:42 at once; try again shortly.",
            "code": "slot_busy",
        }
        assert response["Redislock-Error"] == "slot_busy"
        assert 1 <= int(response["Retry-After"]) <= 20
        assert Client().get("/export/43/").json() == {"ok": True}
        with servers.redis_down():
            response = Client().get("/export/42/")
        assert response.status_code == 503
        assert response.json() == {
            "detail": "The lock service is unavailable; try again shortly.",
            "code": "lock_service_unavailable",
        }


@pytest.mark.usefixtures("real_redis")
@pytest.mark.parametrize("prefix", ["export", "decorated", "async"])
def test_redis_stopped_answers_503_and_logs_the_cause_once(
    redis_server_factory: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.settings import redis_cache

    server = redis_server_factory()
    with override_settings(CACHES={"default": redis_cache(server.url)}):
        assert Client().get(f"/{prefix}/42/").status_code == 200
        server.stop()
        with caplog.at_level("ERROR", logger="django_redislock"):
            answers = [Client(raise_request_exception=True).get(f"/{prefix}/42/") for _ in "ab"]
    assert [(r.status_code, r["Retry-After"]) for r in answers] == [(503, "5")] * 2
    assert b"Traceback" not in answers[0].content
    [record] = [r for r in caplog.records if r.name == "django_redislock.responses"]
    assert "'export:42'" in record.getMessage()
    assert isinstance(record.exc_info[1], LockBackendError)  # type: ignore[index]


# Plain functions and tasks --------------------------------------------------------------


def test_a_plain_function_raises_lock_timeout_when_no_slot_frees() -> None:
    @require_slot("report:<tenant>", limit=1, blocking_timeout=0.05)
    def report(tenant: str) -> str:
        return tenant

    assert report("acme") == "acme"
    with Semaphore("report:acme", 1, timeout=20):
        with pytest.raises(LockTimeout) as caught:
            report(tenant="acme")
    assert caught.value.name == "report:acme"
    assert caught.value.retry_after is not None and 0 < caught.value.retry_after <= 20


def test_a_plain_function_with_redis_down_raises(redis_down: None) -> None:
    @require_slot("report:<tenant>", limit=1, blocking_timeout=0.05)
    def report(tenant: str) -> str:
        return tenant

    with pytest.raises(LockBackendError):
        report("acme")


def test_a_bound_celery_style_task_names_its_key_from_its_arguments() -> None:
    class Task:
        @require_slot("sync:<account>", limit=1, blocking_timeout=0.05)
        def run(self, account: int) -> list[Any]:
            return Semaphore(f"sync:{account}", 1).holders()

    assert len(Task().run(5)) == 1


def test_a_plain_async_function() -> None:
    @require_slot("report:<tenant>", limit=1, blocking_timeout=0.05)
    async def report(tenant: str) -> str:
        return tenant

    async def main() -> None:
        assert await report("acme") == "acme"

    asyncio.run(main())


def test_async_client_gets_429_too(full: Semaphore) -> None:
    async def main() -> int:
        return (await AsyncClient().get("/async/42/")).status_code

    assert asyncio.run(main()) == 429


# Bad arguments: at decoration time ------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (2**53 + 1, ValueError),
        (True, TypeError),
        (2.0, TypeError),
        ("2", TypeError),
        (None, TypeError),
    ],
)
def test_bad_limits(limit: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit must be an int"):
        require_slot("x:<n>", limit=limit)  # type: ignore[arg-type]


def test_limit_is_required() -> None:
    with pytest.raises(TypeError, match="limit"):
        require_slot("x")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"timeout": 0}, ValueError, "timeout"),
        ({"blocking_timeout": -1}, ValueError, "blocking_timeout"),
        ({"on_contention": 200}, ValueError, "on_contention"),
        ({"on_backend_error": "503"}, TypeError, "on_backend_error"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        require_slot("x", limit=2, **kwargs)


def test_unfillable_placeholder_names_require_slot() -> None:
    def job(n: int) -> None:
        pass

    with pytest.raises(ImproperlyConfigured, match="require_slot: placeholder <m>"):
        require_slot("job:<m>", limit=2)(job)


def test_a_generator_function_is_refused() -> None:
    def rows(feed: str) -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match=r"require_slot cannot guard .* Semaphore"):
        require_slot("gen:<feed>", limit=2)(rows)


# Real processes ------------------------------------------------------------------------


@pytest.mark.usefixtures("real_redis")
def test_never_more_than_the_limit_inside_under_50_concurrent_requests() -> None:
    gauge, processes_, threads = Gauge(), 5, 10
    start, statuses = CTX.Barrier(processes_ * threads), CTX.Array("i", 2)
    with processes(slot_workers.requests, [(gauge, start, threads, statuses)] * processes_):
        pass
    assert list(statuses) == [processes_ * threads, 0]  # all served, none refused
    assert gauge.entries == processes_ * threads
    assert gauge.peak == 3


@pytest.mark.usefixtures("real_redis")
def test_slots_are_granted_in_arrival_order(redis_client: redis.Redis) -> None:
    """One of two slots held here: the queued requests go in one at a time, in
    the order they arrived."""
    sem = Semaphore("order:1", 2, timeout=30)
    assert sem.acquire() and sem.acquire()
    queue, args = "redislock:{order:1}:sem:queue", [(i,) for i in range(5)]
    try:
        with queued_in_turn(redis_client, queue, slot_workers.ordered_request, args):
            sem.release()
    finally:
        if sem.owned():
            sem.release()
    assert [int(i) for i in redis_client.lrange("slot-order", 0, -1)] == list(range(5))


@pytest.mark.usefixtures("real_redis")
def test_a_request_refused_by_busy_processes_gets_429_with_their_lease_as_retry_after() -> None:
    """Two requests in other processes hold both slots (their watchdogs renew
    the 4 s leases); a third, here, is refused with a Retry-After no longer
    than the lease, and gets in once they are done."""
    from django.test import RequestFactory

    @require_slot("busy:<pk>", limit=2, timeout=4, blocking_timeout=0.2)
    def third(request: Any, pk: int) -> Any:
        from django.http import HttpResponse

        return HttpResponse("ok")

    inside, done = CTX.Semaphore(0), CTX.Event()
    with processes(slot_workers.held_open_request, [(inside, done)] * 2):
        try:
            for _ in range(2):
                assert inside.acquire(timeout=60), "a slow request never got in"
            refused = third(RequestFactory().get("/busy/1/"), pk=1)
        finally:
            done.set()
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 4
    assert third(RequestFactory().get("/busy/1/"), pk=1).status_code == 200


def _clear_slots(name: str) -> None:
    """What ``manage.py locks clear NAME`` does."""
    from django_redislock.backend.client import get_client
    from django_redislock.ops.inspection import clear

    assert clear(get_client("default"), "redislock", name) == 1


@pytest.mark.django_db(transaction=True)
def test_a_slot_cleared_while_the_view_ran_leaves_its_answer_and_writes_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slot guards no data: its loss is logged, the finished work stands."""
    from django.contrib.auth.models import Group
    from django.db import transaction
    from django.http import HttpResponse
    from django.test import RequestFactory

    @require_slot("report:<pk>", limit=2)
    def report(request: Any, pk: int) -> Any:
        Group.objects.create(name="written")
        _clear_slots(f"report:{pk}")
        return HttpResponse("done")

    with caplog.at_level("WARNING", logger="django_redislock"), transaction.atomic():
        response = report(RequestFactory().get("/report/1/"), pk=1)
    assert (response.status_code, response.content) == (200, b"done")
    assert Group.objects.filter(name="written").exists()
    [record] = [r for r in caplog.records if r.name == "django_redislock.guards"]
    assert "'report:1' was lost" in record.getMessage()


def test_a_slot_cleared_under_an_async_call_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from asgiref.sync import sync_to_async

    @require_slot("report:<pk>", limit=2)
    async def report(pk: int) -> str:
        await sync_to_async(_clear_slots)(f"report:{pk}")
        return "done"

    with caplog.at_level("WARNING", logger="django_redislock"):
        assert asyncio.run(report(1)) == "done"
    assert any(r.name == "django_redislock.guards" for r in caplog.records)
