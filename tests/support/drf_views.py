"""DRF views for the `require_lock` answer tests (`ROOT_URLCONF` is set to this module)."""

from __future__ import annotations

from typing import Any

from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework import viewsets
from rest_framework.decorators import action, api_view, authentication_classes, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.throttling import AnonRateThrottle
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


class Guarded(APIView):
    """Authentication, permissions and throttling run in ``initial()``, from
    ``dispatch``, before the handler: a lock on ``get`` is taken after them."""

    permission_classes = (IsAuthenticated,)
    renderer_classes = (JSONRenderer,)

    @require_lock("report:<pk>", blocking_timeout=0.05)
    def get(self, request: Request, pk: int) -> Response:
        return Response({"ok": True})


@method_decorator(require_lock("report:<pk>", blocking_timeout=0.05), name="dispatch")
class GuardedDispatch(Guarded):
    """The lock on ``dispatch`` is taken before authentication and permissions."""

    def get(self, request: Request, pk: int) -> Response:  # type: ignore[override]
        return Response({"ok": True})


class OncePerMinute(AnonRateThrottle):
    rate = "1/min"
    cache_format = "throttle_drf_test_%(scope)s_%(ident)s"


class Throttled(Plain):
    throttle_classes = (OncePerMinute,)

    @require_lock("report:<pk>", blocking_timeout=0.05)
    def get(self, request: Request, pk: int) -> Response:
        return Response({"ok": True})


class SkuViewSet(viewsets.ViewSet):
    """ViewSet actions: decorate the action methods; ``pk`` comes from the URL."""

    authentication_classes = ()
    permission_classes = ()
    renderer_classes = (JSONRenderer,)

    @require_lock("sku:<pk>", blocking_timeout=0.05)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response({"ok": True})

    @action(detail=True, methods=["post"])
    @require_lock("sku:<pk>", blocking_timeout=0.05)
    def buy(self, request: Request, pk: str) -> Response:
        return Response({"bought": pk})


router = SimpleRouter()
router.register("skus", SkuViewSet, basename="sku")

urlpatterns = [
    path("guarded/<int:pk>/", Guarded.as_view()),
    path("guarded-dispatch/<int:pk>/", GuardedDispatch.as_view()),
    path("throttled/<int:pk>/", Throttled.as_view()),
    *router.urls,
    path("method/<int:pk>/", MethodView.as_view()),
    path("dispatch/<int:pk>/", DispatchView.as_view()),
    path("function/<int:pk>/", function_view),
    path("outer/<int:pk>/", outer_function_view),
]
