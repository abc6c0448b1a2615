"""DRF views for the ``@idempotent`` tests (``ROOT_URLCONF`` is set to this module)."""

from __future__ import annotations

import secrets
from typing import Any

from django.urls import path
from rest_framework import viewsets
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_redislock import idempotent
from tests.support.once_views import ran


def _created(view: str, request: Request) -> Response:
    body = {"run": ran(view), "nonce": secrets.token_hex(8), "data": request.data}
    return Response(body, status=201, headers={"Location": "/orders/7/"})


class Orders(APIView):
    authentication_classes = ()
    permission_classes = ()
    renderer_classes = (JSONRenderer,)

    @idempotent(required=True)
    def post(self, request: Request) -> Response:
        return _created("apiview", request)


class OrderViewSet(viewsets.ViewSet):
    authentication_classes = ()
    permission_classes = ()
    renderer_classes = (JSONRenderer,)

    @idempotent()
    def create(self, request: Request) -> Response:
        return _created("viewset", request)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
@idempotent()
def function_view(request: Request) -> Response:
    return _created("function", request)


router = SimpleRouter()
router.register("viewset", OrderViewSet, basename="order")

urlpatterns: list[Any] = [
    path("orders/", Orders.as_view()),
    path("function/", function_view),
    *router.urls,
]
