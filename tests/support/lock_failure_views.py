"""Views whose lock fails while they run (``ROOT_URLCONF`` is set to this module).

Each view runs ``BODY(pk)`` under ``@require_lock("sku:<pk>")``: the test
replaces ``BODY`` (``monkeypatch.setattr("tests.support.lock_failure_views.BODY", ...)``)
with what happens while the view holds its lock: rows written, the lock
cleared from another client, Redis killed, a nested lock taken.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import require_lock

GRACE = 5.0  # blocking_timeout: nothing else holds these names


def BODY(pk: int) -> None:  # replaced by the tests
    """What the view does under its lock."""


@require_lock("sku:<pk>", blocking_timeout=GRACE)
def function_view(request: HttpRequest, pk: int) -> HttpResponse:
    BODY(pk)
    return HttpResponse("done\n")


class ClassView(View):
    @require_lock("sku:<pk>", blocking_timeout=GRACE)
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        BODY(pk)
        return HttpResponse("done\n")


@method_decorator(require_lock("sku:<pk>", blocking_timeout=GRACE), name="dispatch")
class DispatchView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        BODY(pk)
        return HttpResponse("done\n")


@require_lock("sku:<pk>", blocking_timeout=GRACE)
async def async_view(request: HttpRequest, pk: int) -> HttpResponse:
    await sync_to_async(BODY, thread_sensitive=False)(pk)
    return HttpResponse("done\n")


def _gone(request: HttpRequest, error: Any) -> HttpResponse:
    return HttpResponse(f"gone: {error.name}", status=410)


@require_lock("sku:<pk>", blocking_timeout=GRACE, on_lock_lost=_gone, on_backend_error=502)
def configured_view(request: HttpRequest, pk: int) -> HttpResponse:
    BODY(pk)
    return HttpResponse("done\n")


@require_lock("sku:<pk>", blocking_timeout=GRACE, on_lock_lost="raise", on_backend_error="raise")
def raising_view(request: HttpRequest, pk: int) -> HttpResponse:
    BODY(pk)
    return HttpResponse("done\n")


urlpatterns = [
    path("function/<int:pk>/", function_view),
    path("class/<int:pk>/", ClassView.as_view()),
    path("dispatch/<int:pk>/", DispatchView.as_view()),
    path("async/<int:pk>/", async_view),
    path("configured/<int:pk>/", configured_view),
    path("raising/<int:pk>/", raising_view),
]

try:  # DRF is optional: its views are added when it is installed
    from rest_framework.decorators import api_view, authentication_classes, permission_classes
    from rest_framework.renderers import JSONRenderer
    from rest_framework.request import Request
    from rest_framework.response import Response
    from rest_framework.views import APIView
except ImportError:  # pragma: no cover
    pass
else:

    class DrfView(APIView):
        authentication_classes = ()
        permission_classes = ()
        renderer_classes = (JSONRenderer,)

        @require_lock("sku:<pk>", blocking_timeout=GRACE)
        def get(self, request: Request, pk: int) -> Response:
            BODY(pk)
            return Response({"ok": True})

    @api_view(["GET"])
    @authentication_classes([])
    @permission_classes([])
    @require_lock("sku:<pk>", blocking_timeout=GRACE)
    def drf_function_view(request: Request, pk: int) -> Response:
        BODY(pk)
        return Response({"ok": True})

    urlpatterns += [
        path("drf/<int:pk>/", DrfView.as_view()),
        path("drf-function/<int:pk>/", drf_function_view),
    ]
