from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_redislock import Lock, LockBackendError, LockTimeout, require_lock
from django_redislock import signals as lock_signals
from tests.support import servers
from tests.support.other_holders import OtherThread
from tests.support.signals_helper import capture


@pytest.fixture(autouse=True)
def _views() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.lock_views"):
        yield


@pytest.fixture
def held(other_thread: OtherThread) -> Iterator[Lock]:
    """``sku:42`` held by another holder (a thread of its own)."""
    lock = Lock("sku:42", timeout=20)
    other_thread(lock.acquire)
    yield lock
    other_thread(lock.release)


@pytest.mark.parametrize("prefix", ["buy", "direct", "decorated", "self"])
def test_view_runs_under_the_lock_named_from_url_kwargs(prefix: str) -> None:
    response = Client().get(f"/{prefix}/42/")
    assert response.status_code == 200
    assert response.json() == {"name": "sku:42", "locked": True}
    assert not Lock("sku:42").locked()


@pytest.mark.parametrize("prefix", ["buy", "direct", "decorated", "self"])
def test_contention_answers_423_with_retry_after(
    held: Lock, prefix: str, other_thread: OtherThread
) -> None:
    response = Client().get(f"/{prefix}/42/")
    assert response.status_code == 423
    assert 1 <= int(response["Retry-After"]) <= 20
    assert other_thread(held.owned)


def test_other_names_are_not_contended(held: Lock) -> None:
    assert Client().get("/buy/43/").status_code == 200


def test_on_contention_status(held: Lock) -> None:
    response = Client().get("/buy-503/42/")
    assert response.status_code == 503
    assert "Retry-After" in response


def test_on_contention_callable(held: Lock) -> None:
    response = Client().get("/buy-custom/42/")
    assert response.status_code == 409
    assert response.content == b"busy: sku:42"


def test_on_contention_raise(held: Lock) -> None:
    with pytest.raises(LockTimeout):
        Client(raise_request_exception=True).get("/buy-raise/42/")


def test_lock_is_released_when_the_view_raises() -> None:
    with pytest.raises(RuntimeError, match="the view failed"):
        Client().get("/boom/7/")
    assert not Lock("sku:7").locked()


@pytest.mark.parametrize(
    "code",
    ["%0A", "%7F", "x" * 1100],
    ids=["newline", "delete", "too-long"],
)
def test_unusable_name_is_a_400_not_a_500(code: str) -> None:
    response = Client(raise_request_exception=False).get(f"/code/{code}/")
    assert response.status_code == 400


def test_unusual_but_valid_names_work() -> None:
    response = Client().get("/code/%7Bbraces%7D*%25/")
    assert response.status_code == 200
    assert response.json() == {"name": "code:{braces}*%", "locked": True}


@pytest.mark.django_db
def test_async_view_uses_async_lock() -> None:
    response = asyncio.run(AsyncClient().get("/async/42/"))
    assert response.status_code == 200
    assert response.json() == {"name": "sku:42", "locked": True}
    assert not Lock("sku:42").locked()


def test_async_view_contention(held: Lock) -> None:
    response = asyncio.run(AsyncClient().get("/async/42/"))
    assert response.status_code == 423
    assert "Retry-After" in response


def test_attribute_placeholders_follow_the_request() -> None:
    seen: list[bool] = []

    @require_lock("user:<request.user.pk>")
    def view(request: Any) -> Any:
        seen.append(Lock("user:7").locked())
        return "ok"

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(pk=7)  # type: ignore[assignment]
    assert view(request) == "ok"
    assert seen == [True]


def test_none_placeholder_on_a_view_is_a_400() -> None:
    from django.core.exceptions import BadRequest

    @require_lock("user:<request.user.pk>")
    def view(request: Any) -> Any:
        return "ok"

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(pk=None)  # type: ignore[assignment]
    with pytest.raises(BadRequest, match="is None"):
        view(request)


# --- plain functions and tasks ------------------------------------------------------


def test_plain_function_by_argument_name_positional_or_keyword() -> None:
    calls: list[bool] = []

    @require_lock("report:<account_id>:<period>")
    def build(account_id: int, period: str = "2026-11") -> str:
        calls.append(Lock(f"report:{account_id}:{period}").locked())
        return "built"

    assert build(5) == "built"
    assert build(account_id=6, period="2026-10") == "built"
    assert calls == [True, True]


def test_plain_function_contention_raises_lock_timeout(other_thread: OtherThread) -> None:
    @require_lock("job:<job>", blocking_timeout=0.05)
    def run(job: str) -> None:
        raise AssertionError("must not run")

    holder = Lock("job:nightly", timeout=20)
    other_thread(holder.acquire)
    try:
        with pytest.raises(LockTimeout) as info:
            run("nightly")
        assert info.value.name == "job:nightly"
        assert info.value.retry_after is not None
    finally:
        other_thread(holder.release)


@pytest.mark.parametrize(
    ("value", "match"),
    [("a\x00b", "control characters"), ("x" * 1100, "limit is 1024"), (None, "is None")],
)
def test_plain_function_unusable_name_is_value_error(value: object, match: str) -> None:
    @require_lock("job:<job>")
    def run(job: object) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=match):
        run(value)


def test_plain_async_function() -> None:
    @require_lock("job:<job>")
    async def run(job: str) -> bool:
        from django_redislock import AsyncLock

        return await AsyncLock(f"job:{job}").locked()

    assert asyncio.run(run("a")) is True
    assert not Lock("job:a").locked()


class _Task:
    """What Celery's ``app.task`` builds: a class whose ``run`` is the function."""

    run: Any
    request = SimpleNamespace(id="task-1")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


def _task(bind: bool = False) -> Any:
    def decorate(fun: Any) -> Any:
        run = fun if bind else staticmethod(fun)
        return type(fun.__name__, (_Task,), {"run": run})()

    return decorate


def test_celery_style_tasks_plain_and_bound() -> None:
    seen: list[str] = []

    @_task()
    @require_lock("import:<feed>")
    def import_feed(feed: str) -> None:
        seen.append(f"plain:{Lock(f'import:{feed}').locked()}")

    @_task(bind=True)
    @require_lock("import:<feed>:<self.request.id>")
    def import_bound(self: Any, feed: str) -> None:
        seen.append(f"bound:{Lock(f'import:{feed}:task-1').locked()}")

    import_feed("prices")
    import_bound("prices")
    assert seen == ["plain:True", "bound:True"]


# --- decoration-time errors ---------------------------------------------------------


def test_unfillable_placeholder_is_improperly_configured_at_decoration() -> None:
    def buy(request: Any, pk: int) -> None: ...

    with pytest.raises(ImproperlyConfigured) as info:
        require_lock("sku:<sku_id>")(buy)
    message = str(info.value)
    assert "<sku_id>" in message
    assert "buy" in message


def test_kwargs_views_accept_url_kwargs_placeholders() -> None:
    def view(request: Any, **kwargs: Any) -> None: ...

    require_lock("sku:<pk>")(view)  # no error: URL kwargs may fill it


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("", ValueError),
        (42, TypeError),
        ("sku:<>", ValueError),
        ("sku:<1x>", ValueError),
        ("sku:<pk", ValueError),
        ("sku:pk>", ValueError),
        ("sku:<a b>", ValueError),
    ],
)
def test_malformed_templates(template: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        require_lock(template)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"on_contention": 200}, ValueError),
        ({"on_contention": "ignore"}, TypeError),
        ({"on_contention": True}, TypeError),
        ({"timeout": -1}, ValueError),
        ({"blocking_timeout": float("nan")}, ValueError),
        ({"using": ""}, TypeError),
    ],
)
def test_bad_options(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        require_lock("x", **kwargs)


# --- nesting ----------------------------------------------------------------------


def test_nested_calls_with_the_same_name_nest_instead_of_waiting() -> None:
    @require_lock("account:<account_id>", blocking_timeout=0.2)
    def inner(account_id: int) -> bool:
        return Lock(f"account:{account_id}").locked()

    @require_lock("account:<account_id>", blocking_timeout=0.2)
    def outer(account_id: int) -> tuple[bool, bool]:
        first = inner(account_id)  # would be LockTimeout without nesting
        return first, Lock(f"account:{account_id}").locked()

    assert outer(1) == (True, True)  # still held after the inner call returned
    assert not Lock("account:1").locked()


def test_another_thread_does_not_reuse_the_callers_lock() -> None:
    import contextvars
    import threading

    results: list[object] = []

    @require_lock("job:<job>", blocking_timeout=0.1)
    def run(job: str) -> str:
        return "ran"

    @require_lock("job:<job>")
    def outer(job: str) -> None:
        context = contextvars.copy_context()  # what asgiref's sync_to_async does

        def in_thread() -> None:
            try:
                results.append(context.run(run, job))
            except LockTimeout as exc:
                results.append(exc)

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()

    outer("x")
    assert len(results) == 1
    assert isinstance(results[0], LockTimeout)


def test_nested_async_calls_nest() -> None:
    from django_redislock import AsyncLock

    @require_lock("job:<job>", blocking_timeout=0.2)
    async def inner(job: str) -> bool:
        return await AsyncLock(f"job:{job}").locked()

    @require_lock("job:<job>", blocking_timeout=0.2)
    async def outer(job: str) -> bool:
        return await inner(job)

    assert asyncio.run(outer("a")) is True
    assert not Lock("job:a").locked()


def test_async_function_that_raises_releases_the_lock() -> None:
    @require_lock("job:<job>")
    async def run(job: str) -> None:
        raise KeyError(job)

    with pytest.raises(KeyError):
        asyncio.run(run("boom"))
    assert not Lock("job:boom").locked()


@pytest.mark.slow
def test_workers_merging_one_machine_record_lose_nothing(
    redis_client: Any, real_redis: None
) -> None:
    import json

    from tests.support.decorator_workers import merge_many
    from tests.support.procs import processes

    sources = ["hardware", "services", "assets", "offline"]
    with processes(merge_many, [(7, source, 50) for source in sources]):
        pass
    record = json.loads(redis_client.get("machine-record:7") or "{}")
    merged = {source: len(values) for source, values in record.items()}
    assert merged == dict.fromkeys(sources, 50)


# Redis down: 503 (or as configured), never a 500 traceback ----------------------------


@pytest.fixture
def redis_down() -> Iterator[None]:
    with servers.redis_down():
        yield


@pytest.mark.parametrize("prefix", ["buy", "decorated", "async"])
def test_redis_down_answers_503_with_retry_after_and_logs_the_cause(
    redis_down: None, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("ERROR", logger="django_redislock"):
        response = Client(raise_request_exception=True).get(f"/{prefix}/42/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"unavailable" in response.content
    assert b"Traceback" not in response.content
    [record] = [r for r in caplog.records if r.name == "django_redislock.responses"]
    assert record.levelname == "ERROR"
    assert "'sku:42'" in record.getMessage()
    assert f"/{prefix}/42/" in record.getMessage()
    assert isinstance(record.exc_info[1], LockBackendError)  # type: ignore[index]
    assert "ConnectionError" in str(record.exc_info[1])  # type: ignore[index]


def test_on_backend_error_status_callable_and_raise(redis_down: None) -> None:
    client = Client(raise_request_exception=True)
    response = client.get("/down-500/42/")
    assert (response.status_code, response["Retry-After"]) == (500, "5")
    response = client.get("/down-custom/42/")
    assert (response.status_code, response.content) == (502, b"down: sku:42")
    with pytest.raises(LockBackendError):
        client.get("/down-raise/42/")


def test_plain_function_with_redis_down_raises(redis_down: None) -> None:
    @require_lock("job:<n>", blocking_timeout=0.05)
    def job(n: int) -> int:
        return n

    with pytest.raises(LockBackendError):
        job(1)


@pytest.mark.parametrize("value", [200, "503", True])
def test_bad_on_backend_error(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="on_backend_error"):
        require_lock("x", on_backend_error=value)  # type: ignore[arg-type]


# Retry-After: estimated from the name's history, capped by the lease ------------------


def _keys(name: str) -> tuple[str, str]:
    from django_redislock.backend import client as backend
    from django_redislock.conf import get_settings

    prefix = get_settings().key_prefix
    return backend.key(prefix, name, "stats"), backend.key(prefix, name, "queue")


def test_retry_after_without_history_is_the_remaining_lease(held: Lock) -> None:
    assert 15 <= int(Client().get("/buy/42/")["Retry-After"]) <= 20


def test_retry_after_is_the_average_wait_times_the_queue(
    held: Lock, redis_client: redis.Redis
) -> None:
    stats, queue = _keys("sku:42")
    # two acquires waited 6000 ms in all before they got it (and one gave up)
    redis_client.hset(stats, mapping={"contended": 3, "waited": 2, "wait_ms": 6000})
    assert Client().get("/buy/42/")["Retry-After"] == "3"
    redis_client.zadd(queue, {"waiter-a": 1, "waiter-b": 2})
    # 3000 ms a wait, times the current hold and two queued waiters
    assert Client().get("/buy/42/")["Retry-After"] == "9"
    redis_client.delete(queue)


def test_retry_after_holds_up_under_a_storm_of_refusals(
    held: Lock, redis_client: redis.Redis
) -> None:
    """Refusals count as contended but add no wait time: the estimate must
    not shrink with each 423 (it fell 3, 2, 2, 2, 2, 1, 1, 1 when it did)."""
    stats, _ = _keys("sku:42")
    redis_client.hset(stats, mapping={"contended": 3, "waited": 3, "wait_ms": 9000})
    answers = [Client().get("/buy/42/")["Retry-After"] for _ in range(8)]
    assert answers == ["3"] * 8
    assert int(redis_client.hget(stats, "contended")) == 11  # each refusal was counted


def test_retry_after_from_counters_kept_before_waited_was_counted(
    held: Lock, redis_client: redis.Redis
) -> None:
    """A counters hash without ``waited`` (an hour's memory across an
    upgrade) still gives an estimate: wait time over the contended calls."""
    stats, _ = _keys("sku:42")
    redis_client.hset(stats, mapping={"contended": 1, "wait_ms": 6000})
    # the refused request counts itself: 6000 ms over 2 contended calls
    assert Client().get("/buy/42/")["Retry-After"] == "3"


def test_retry_after_is_capped_by_the_holders_lease(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    stats, _ = _keys("sku:9")
    redis_client.hset(stats, mapping={"contended": 1, "wait_ms": 1_000_000})
    holder = Lock("sku:9", timeout=4)
    other_thread(holder.acquire)
    assert 1 <= int(Client().get("/buy/9/")["Retry-After"]) <= 4
    other_thread(holder.release)


def test_retry_after_follows_real_short_holds(
    redis_client: redis.Redis, other_thread: OtherThread
) -> None:
    """A 0.3 s hold under a 20 s lease: the header says 1, not 20."""
    _, queue = _keys("sku:7")
    first = Lock("sku:7", timeout=20)
    first.acquire()
    waiter_done = threading.Event()

    def wait() -> None:
        with Lock("sku:7", timeout=20, blocking_timeout=10):
            pass
        waiter_done.set()

    waited = threading.Thread(target=wait)
    waited.start()
    deadline = time.monotonic() + 10
    while not redis_client.zcard(queue) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the hold being measured
    first.release()
    assert waiter_done.wait(10)
    waited.join()
    holder = Lock("sku:7", timeout=20)
    other_thread(holder.acquire)
    assert Client().get("/buy/7/")["Retry-After"] == "1"
    other_thread(holder.release)


# DRF views: {"detail": ...} JSON ---------------------------------------------------


@pytest.mark.parametrize("prefix", ["method", "dispatch", "function", "outer"])
def test_drf_views_get_drf_json_for_423_and_503(held: Lock, prefix: str) -> None:
    pytest.importorskip("rest_framework")
    with override_settings(ROOT_URLCONF="tests.support.drf_views"):
        response = Client().get(f"/{prefix}/42/")
        assert response.status_code == 423
        assert response["Content-Type"] == "application/json"
        assert response.json() == {
            "detail": "sku:42 is busy; try again shortly.",
            "code": "lock_busy",
        }
        assert response["Redislock-Error"] == "lock_busy"
        assert 1 <= int(response["Retry-After"]) <= 20
        assert Client().get(f"/{prefix}/43/").json() == {"ok": True}
        with servers.redis_down():
            response = Client().get(f"/{prefix}/42/")
        assert response.status_code == 503
        assert response.json() == {
            "detail": "The lock service is unavailable; try again shortly.",
            "code": "lock_service_unavailable",
        }
        assert response["Redislock-Error"] == "lock_service_unavailable"
        assert response["Retry-After"] == "5"


def test_plain_views_keep_plain_text_with_drf_imported(held: Lock) -> None:
    pytest.importorskip("rest_framework.views")
    response = Client().get("/buy/42/")
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Redislock-Error"] == "lock_busy"  # the code of a plain answer


# Redis failing on the release, after the view ran ------------------------------------------


@pytest.fixture
def release_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_redislock.primitives import lock as locks

    class Down:
        """The release script (its call spec too), but Redis is gone when it runs."""

        real = locks.LOCK_RELEASE

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

        def __call__(self, *args: object, **kwargs: object) -> None:
            raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr("django_redislock.primitives.lock.LOCK_RELEASE", Down())


@pytest.mark.usefixtures("release_fails")
def test_a_view_whose_release_fails_still_answers_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("ERROR", logger="django_redislock"):
        response = Client().get("/buy/77/")
    assert response.status_code == 200  # the work is done: no 500, no retry invited
    assert any("Could not release 'sku:77'" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("release_fails")
def test_the_views_own_error_is_not_replaced_by_a_failed_release() -> None:
    with pytest.raises(RuntimeError, match="the view failed"):
        Client(raise_request_exception=True).get("/boom/78/")


@pytest.mark.usefixtures("release_fails")
def test_a_plain_function_whose_release_fails_raises() -> None:
    @require_lock("job:<job>")
    def run(job: str) -> str:
        return "done"

    with pytest.raises(LockBackendError):
        run("x")


def test_a_function_called_from_another_view_locks_the_name_it_was_called_for(
    other_thread: OtherThread,
) -> None:
    """Its own arguments win over the calling view's URL kwargs (found by an
    independent review: ``reserve(request, pk=7)`` from ``/order/<pk>/`` with
    order 99 locked ``sku:99``, and ran while ``sku:7`` was held)."""
    from django.http import HttpResponse
    from django.urls import ResolverMatch

    seen: list[bool] = []

    @require_lock("sku:<pk>", blocking_timeout=0)
    def reserve(request: Any, pk: int) -> HttpResponse:
        seen.append(Lock("sku:7").locked())
        return HttpResponse("ok")

    request = RequestFactory().get("/order/99/checkout/")
    request.resolver_match = ResolverMatch(lambda r: None, (), {"pk": 99})
    assert reserve(request, pk=7).status_code == 200
    assert seen == [True]  # it ran under sku:7, not sku:99
    holder = Lock("sku:7")
    assert other_thread(holder.acquire)
    try:
        assert reserve(request, pk=7).status_code == 423  # sku:7 is taken: it waits its turn
    finally:
        other_thread(holder.release)
    assert seen == [True]


def test_a_query_parameter_left_out_is_a_400_not_a_500() -> None:
    from django.core.exceptions import BadRequest
    from django.http import HttpResponse

    @require_lock("sku:<request.GET.sku>")
    def view(request: Any) -> HttpResponse:
        raise AssertionError("must not run")

    with pytest.raises(BadRequest, match=r"<request\.GET\.sku> was not given"):
        view(RequestFactory().get("/buy/"))


# found by a review of the Django integration --------------------------------------------


def test_a_generator_function_is_refused_when_decorated() -> None:
    """Its body runs after the call returned, and the lock with it."""

    def rows(feed: str) -> Iterator[int]:
        yield 1

    async def arows(feed: str) -> Any:
        yield 1

    for func in (rows, arows):
        with pytest.raises(TypeError, match="a generator function: its body runs after"):
            require_lock("gen:<feed>")(func)


def test_a_mappings_key_comes_before_its_attributes() -> None:
    """``<request.GET.items>`` is the query's ``items``, as in Django's
    templates; it was the bound method, a new lock name on every request."""
    held: list[bool] = []

    @require_lock("cart:<request.GET.items>")
    def view(request: Any) -> Any:
        held.append(Lock("cart:3").owned())
        return "ok"

    assert view(RequestFactory().get("/?items=3")) == "ok"
    assert held == [True]
    from django.core.exceptions import BadRequest

    with pytest.raises(BadRequest, match="was not given"):
        view(RequestFactory().get("/"))


def test_none_part_way_along_a_placeholder_is_a_400() -> None:
    from django.core.exceptions import BadRequest

    @require_lock("order:<request.user.profile.pk>")
    def view(request: Any) -> Any:
        raise AssertionError("must not run")

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(profile=None)
    with pytest.raises(BadRequest, match="is None"):
        view(request)


def test_method_decorator_with_a_list_of_decorators() -> None:
    """``require_lock`` then gets another decorator's wrapper of the bound
    method, whose ``__wrapped__`` chain ends at the unbound method."""
    from django.http import HttpResponse
    from django.utils.decorators import method_decorator
    from django.views import View
    from django.views.decorators.http import require_GET

    seen: list[bool] = []

    class Orders(View):
        @method_decorator([require_lock("user:<request.user.pk>:<self.kwargs.pk>"), require_GET])
        def get(self, request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
            seen.append(Lock("user:7:9").owned())
            return HttpResponse("ok")

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(is_authenticated=True, pk=7)
    assert Orders.as_view()(request, pk=9).status_code == 200
    assert seen == [True]


def test_the_documented_one_checkout_per_user_recipe(other_thread: OtherThread) -> None:
    """docs/decorators.md's ``checkout``, run from the page: an anonymous request
    goes to the login page without a lock; a user's second request is refused
    at once while the first holds the lock, and other users are not."""
    from django.contrib.auth.models import AnonymousUser

    page = Path(__file__).resolve().parent.parent / "docs" / "decorators.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if "def checkout" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(page), "exec"), namespace)
    checkout = namespace["checkout"]

    def post(user: Any) -> Any:
        request = RequestFactory().post("/checkout/")
        request.user = user
        return checkout(request)

    with capture(lock_signals.lock_acquired) as calls:
        anonymous = post(AnonymousUser())
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert calls == []
    first = Lock("checkout:7", timeout=20)
    other_thread(first.acquire)  # the user's first checkout, still running
    try:
        started = time.monotonic()
        second = post(SimpleNamespace(is_authenticated=True, pk=7))
        assert second.status_code == 423
        assert time.monotonic() - started < 2  # blocking_timeout=0: no wait
        assert post(SimpleNamespace(is_authenticated=True, pk=8)).status_code == 200
    finally:
        other_thread(first.release)
    assert post(SimpleNamespace(is_authenticated=True, pk=7)).content == b"ordered\n"
