"""Views for the ``@idempotent`` tests (``ROOT_URLCONF`` is set to this module).

Each counts its runs in Redis (``once:runs:<view>``), so a test sees how often
the work ran; ``slow`` waits on a Redis list, so a test holds it mid-run.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import idempotent
from django_redislock.backend.client import get_client
from django_redislock.once.views import MAX_STORED_BYTES


def ran(view: str) -> int:
    return int(get_client("default").incr(f"once:runs:{view}"))


def _paid(view: str) -> HttpResponse:
    response = JsonResponse({"run": ran(view), "nonce": secrets.token_hex(8)}, status=201)
    response["Location"] = "/orders/7/"
    response.set_cookie("seen", "1")
    return response


@idempotent()
def pay(request: HttpRequest) -> HttpResponse:
    return _paid("pay")


@idempotent(required=True)
def pay_required(request: HttpRequest) -> HttpResponse:
    return _paid("pay_required")


@idempotent(methods=("POST",), ttl=60)
def post_only(request: HttpRequest) -> HttpResponse:
    return _paid("post_only")


@idempotent()
def slow(request: HttpRequest) -> HttpResponse:
    client = get_client("default")
    client.rpush("once:entered", "1")
    assert client.blpop(["once:go"], timeout=30), "the test never let the view go on"
    return _paid("slow")


@idempotent()
def server_error(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"run {ran('server_error')}", status=503)


@idempotent()
def bad_request(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"run {ran('bad_request')}", status=400)


@idempotent()
def upload(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"run {ran('upload')}: {request.FILES['file'].size} bytes", status=201)


@idempotent()
def busy(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"run {ran('busy')}", status=423, headers={"Retry-After": "1"})


@idempotent()
def stream(request: HttpRequest) -> StreamingHttpResponse:
    ran("stream")
    return StreamingHttpResponse(iter([b"a", b"b"]))


@idempotent()
def big(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"x" * (MAX_STORED_BYTES + ran("big")))


@idempotent()
def boom(request: HttpRequest) -> HttpResponse:
    ran("boom")
    raise RuntimeError("the view failed")


@transaction.atomic
@idempotent()
def rolled_back(request: HttpRequest) -> HttpResponse:
    transaction.set_rollback(True)  # as a view's failed validation would
    return _paid("rolled_back")


@transaction.atomic
@idempotent()
def committed(request: HttpRequest) -> HttpResponse:
    return _paid("committed")


class PayView(View):
    @method_decorator(idempotent())
    def post(self, request: HttpRequest) -> HttpResponse:
        return _paid("class")


class DirectPayView(View):
    @idempotent()
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _paid("direct")


@idempotent()
async def pay_async(request: HttpRequest) -> HttpResponse:
    from asgiref.sync import sync_to_async

    run = await sync_to_async(ran)("async")
    return JsonResponse({"run": run, "nonce": secrets.token_hex(8)}, status=201)


@idempotent()
def buy(request: HttpRequest, pk: int) -> HttpResponse:
    """The shop's buy, under ``ATOMIC_REQUESTS`` in the process tests."""
    from tests.models import Item

    left = Item.objects.get(pk=pk).deduct(1)
    return JsonResponse({"left": left, "nonce": secrets.token_hex(8)}, status=201)


@idempotent()
def buy_gated(request: HttpRequest, pk: int) -> HttpResponse:
    """``buy``, held after its deduction until the test lets it answer."""
    from tests.models import Item

    left = Item.objects.get(pk=pk).deduct(1)
    client = get_client("default")
    client.rpush("once:entered", "1")
    assert client.blpop(["once:go"], timeout=60), "the test never let the view go on"
    return JsonResponse({"left": left, "nonce": secrets.token_hex(8)}, status=201)


urlpatterns = [
    path("pay/", pay),
    path("pay-required/", pay_required),
    path("post-only/", post_only),
    path("slow/", slow),
    path("server-error/", server_error),
    path("bad-request/", bad_request),
    path("upload/", upload),
    path("busy/", busy),
    path("stream/", stream),
    path("big/", big),
    path("boom/", boom),
    path("rolled-back/", rolled_back),
    path("committed/", committed),
    path("class/", PayView.as_view()),
    path("direct/", DirectPayView.as_view()),
    path("async/", pay_async),
    path("buy/<int:pk>/", buy),
    path("buy-gated/<int:pk>/", buy_gated),
]
