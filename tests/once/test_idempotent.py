"""``@idempotent`` on Django views: the semantics table of docs/once.md, one
row at a time, against the suite's redis-server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings

from django_redislock import idempotent
from tests.settings import redis_cache
from tests.support.servers import free_port

pytestmark = pytest.mark.usefixtures("real_redis")


@pytest.fixture(autouse=True)
def _once_urls() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.support.once_views"):
        yield


def post(path: str, key: str | None = "k-1", body: str = '{"sku": 1}', **extra: Any) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return Client().post(path, body, content_type="application/json", headers=headers, **extra)


def runs(client: redis.Redis, view: str) -> int:
    return int(client.get(f"once:runs:{view}") or 0)


def records(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter("*:{idempotency:*}:idempotency"))


def test_a_repeat_after_the_first_finished_gets_its_response_byte_for_byte(
    redis_client: redis.Redis,
) -> None:
    first = post("/pay/")
    again = post("/pay/")
    assert first.status_code == again.status_code == 201
    assert again.content == first.content  # the same nonce: not run again
    assert again["Content-Type"] == first["Content-Type"]
    assert again["Location"] == "/orders/7/"
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert "seen" in first.cookies and "seen" not in again.cookies  # cookies are not replayed
    assert runs(redis_client, "pay") == 1


def test_a_quoted_key_and_the_same_bare_key_are_one_key(redis_client: redis.Redis) -> None:
    assert post("/pay/", key='"k-1"').status_code == 201
    assert post("/pay/", key="k-1")["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "pay") == 1


def test_the_same_key_with_another_body_is_422(redis_client: redis.Redis) -> None:
    assert post("/pay/").status_code == 201
    mismatch = post("/pay/", body='{"sku": 2}')
    assert mismatch.status_code == 422
    assert mismatch["Redislock-Error"] == "idempotency_key_mismatch"
    assert b"different request body" in mismatch.content
    assert runs(redis_client, "pay") == 1


def test_a_repeat_while_the_first_runs_is_409_then_gets_its_response(
    redis_client: redis.Redis,
) -> None:
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(post("/slow/")))
    first.start()
    try:
        assert redis_client.blpop(["once:entered"], timeout=30), "the first never ran"
        running = post("/slow/")
        assert running.status_code == 409
        assert running["Retry-After"] == "1"
        assert running["Redislock-Error"] == "idempotency_key_in_use"
        assert post("/slow/", body="{}").status_code == 422  # another body, even while it runs
    finally:
        redis_client.rpush("once:go", "1")
        first.join(30)
    assert answers[0].status_code == 201
    replay = post("/slow/")
    assert replay.content == answers[0].content and replay["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "slow") == 1


def test_no_key_runs_as_if_undecorated_unless_required(redis_client: redis.Redis) -> None:
    assert post("/pay/", key=None).status_code == 201
    assert post("/pay/", key=None).status_code == 201
    assert runs(redis_client, "pay") == 2
    missing = post("/pay-required/", key=None)
    assert missing.status_code == 400 and b"Idempotency-Key" in missing.content
    assert missing["Redislock-Error"] == "idempotency_key_missing"
    assert runs(redis_client, "pay_required") == 0
    assert records(redis_client) == []


@pytest.mark.parametrize("key", ["", '"', "caf\u00e9", "a b", "x" * 256, '"a"b"'])
def test_a_malformed_key_is_400(key: str, redis_client: redis.Redis) -> None:
    answer = post("/pay/", key=key)
    assert answer.status_code == 400 and answer["Redislock-Error"] == "idempotency_key_malformed"
    assert runs(redis_client, "pay") == 0


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_an_upload_too_big_to_read_whole_is_fingerprinted_from_its_parts(
    redis_client: redis.Redis,
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    def send(size: int) -> Any:
        upload = SimpleUploadedFile("a.bin", b"x" * size)
        return Client().post("/upload/", {"file": upload}, headers={"Idempotency-Key": "u-1"})

    first = send(5000)
    assert first.status_code == 201 and first.content == b"run 1: 5000 bytes"
    assert send(5000)["Idempotent-Replayed"] == "true"
    assert send(6000).status_code == 422  # another file
    assert runs(redis_client, "upload") == 1


def test_the_key_is_scoped_by_method_path_and_user(
    redis_client: redis.Redis, django_user_model: Any
) -> None:
    assert post("/pay/").status_code == 201
    assert post("/class/").status_code == 201  # another path: another key
    put = Client().put("/pay/", '{"sku": 1}', content_type="application/json",
                       headers={"Idempotency-Key": "k-1"})  # fmt: skip
    assert "Idempotent-Replayed" not in put  # another method
    user = django_user_model.objects.create_user("ann")
    logged_in = Client()
    logged_in.force_login(user)
    mine = logged_in.post("/pay/", '{"sku": 1}', content_type="application/json",
                          headers={"Idempotency-Key": "k-1"})  # fmt: skip
    assert mine.status_code == 201 and "Idempotent-Replayed" not in mine  # another user
    assert runs(redis_client, "pay") == 3


def test_methods_not_listed_are_not_looked_at(redis_client: redis.Redis) -> None:
    for _ in range(2):
        put = Client().put("/post-only/", "{}", headers={"Idempotency-Key": "k"})
        assert put.status_code == 201 and "Idempotent-Replayed" not in put
    assert runs(redis_client, "post_only") == 2


@pytest.mark.parametrize("view", ["server-error", "busy"])
def test_a_5xx_or_a_try_again_is_not_stored_and_a_retry_runs_again(
    view: str, redis_client: redis.Redis
) -> None:
    assert post(f"/{view}/").content == b"run 1"
    assert post(f"/{view}/").content == b"run 2"
    assert records(redis_client) == []
    assert not list(redis_client.scan_iter("*:{idempotency:*}:lock"))


def test_a_4xx_is_stored_and_replayed(redis_client: redis.Redis) -> None:
    assert post("/bad-request/").status_code == 400
    again = post("/bad-request/")
    assert again.content == b"run 1" and again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(("view", "reason"), [("stream", "streaming"), ("big", "too large")])
def test_streaming_and_large_responses_are_not_stored_and_say_so(
    view: str, reason: str, redis_client: redis.Redis
) -> None:
    first = post(f"/{view}/")
    assert first["Idempotent-Not-Stored"] == reason
    assert "Idempotent-Replayed" not in post(f"/{view}/")
    assert runs(redis_client, view) == 2
    assert records(redis_client) == []


def test_an_exception_stores_nothing_and_frees_the_key(redis_client: redis.Redis) -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError):
            post("/boom/")
    assert runs(redis_client, "boom") == 2
    assert records(redis_client) == []
    assert not list(redis_client.scan_iter("*:{idempotency:*}:lock"))


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_stores_nothing(redis_client: redis.Redis) -> None:
    assert post("/rolled-back/").status_code == 201
    assert "Idempotent-Replayed" not in post("/rolled-back/")
    assert runs(redis_client, "rolled_back") == 2
    assert records(redis_client) == []
    assert not list(redis_client.scan_iter("*:{idempotency:*}:lock"))


@pytest.mark.django_db(transaction=True)
def test_a_committed_transaction_stores_its_response_before_the_lock_is_released(
    redis_client: redis.Redis,
) -> None:
    first = post("/committed/")
    assert not list(redis_client.scan_iter("*:{idempotency:*}:lock"))  # released after commit
    assert len(records(redis_client)) == 1
    assert post("/committed/").content == first.content
    assert runs(redis_client, "committed") == 1


@pytest.mark.parametrize("path", ["/class/", "/direct/"])
def test_class_based_views(path: str, redis_client: redis.Redis) -> None:
    first = post(path)
    assert post(path).content == first.content
    assert runs(redis_client, "class" if path == "/class/" else "direct") == 1


def test_async_views_under_asgi(redis_client: redis.Redis) -> None:
    async def three() -> list[Any]:
        client, key = AsyncClient(), {"Idempotency-Key": "k-async"}
        return [
            await client.post("/async/", body, content_type="application/json", headers=key)
            for body in ("{}", "{}", "[]")
        ]

    first, again, mismatch = asyncio.run(three())
    assert first.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert mismatch.status_code == 422
    assert runs(redis_client, "async") == 1


def test_redis_unreachable_is_503_and_the_view_does_not_run(redis_client: redis.Redis) -> None:
    down = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=down):
        answer = post("/pay/")
    assert answer.status_code == 503 and answer["Retry-After"] == "5"
    assert answer["Redislock-Error"] == "lock_service_unavailable"
    assert runs(redis_client, "pay") == 0


def test_a_call_without_a_request_is_a_type_error() -> None:
    @idempotent()
    def not_a_view(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="without a request"):
        not_a_view(1)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": "1"}, TypeError, "ttl"),
        ({"ttl": None}, TypeError, "ttl"),
        ({"required": "yes"}, TypeError, "required"),
        ({"methods": "POST"}, TypeError, "methods"),
        ({"methods": ("post",)}, ValueError, "methods"),
        ({"methods": ()}, ValueError, "methods"),
        ({"using": ""}, TypeError, "using"),
        ({"using": "nope"}, ImproperlyConfigured, "nope"),
    ],
)
def test_bad_options_fail_at_decoration(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        idempotent(**options)


def test_a_generator_cannot_be_decorated() -> None:
    def gen(request: Any) -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match="generator"):
        idempotent()(gen)
