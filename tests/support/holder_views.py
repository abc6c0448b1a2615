"""Views whose 423 says who holds the name, to staff (``ROOT_URLCONF`` of
``tests/test_holder_answers.py``): a plain view, and DRF views whose
authentication makes the request staff when it asks (header ``X-Staff: 1``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.authentication import BaseAuthentication
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislock import require_lock


class StaffUser:
    is_active = True
    is_staff = True
    is_authenticated = True
    is_anonymous = False
    pk = 1


class StaffHeader(BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[StaffUser, None] | None:
        return (StaffUser(), None) if request.META.get("HTTP_X_STAFF") == "1" else None


@require_lock("who:<pk>", blocking_timeout=0.05)
def plain(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ok\n")


class Api(APIView):
    authentication_classes = (StaffHeader,)
    permission_classes = ()
    renderer_classes = (JSONRenderer,)

    @require_lock("who:<pk>", blocking_timeout=0.05)
    def get(self, request: Request, pk: int) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("plain/<int:pk>/", plain),
    path("api/<int:pk>/", Api.as_view()),
]
