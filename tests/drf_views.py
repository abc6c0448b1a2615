"""DRF views for the `require_lock` answer tests (`ROOT_URLCONF` is set to this module)."""

from __future__ import annotations

from typing import Any

from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislock import require_lock


class Plain(APIView):
    authentication_classes = ()
    permission_classes = ()
    renderer_classes = (JSONRenderer,)


class MethodView(Plain):
    @require_lock("sku:<pk>", blocking_timeout=0.05)
    def get(self, request: Request, pk: int) -> Response:
        return Response({"ok": True})


@method_decorator(require_lock("sku:<pk>", blocking_timeout=0.05), name="dispatch")
class DispatchView(Plain):
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response({"ok": True})


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
@require_lock("sku:<pk>", blocking_timeout=0.05)
def function_view(request: Request, pk: int) -> Response:
    return Response({"ok": True})


@require_lock("sku:<pk>", blocking_timeout=0.05)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def outer_function_view(request: Request, pk: int) -> Response:
    return Response({"ok": True})


urlpatterns = [
    path("method/<int:pk>/", MethodView.as_view()),
    path("dispatch/<int:pk>/", DispatchView.as_view()),
    path("function/<int:pk>/", function_view),
    path("outer/<int:pk>/", outer_function_view),
]
