"""DRF views for the ``require_slot`` tests (``ROOT_URLCONF`` is set to this module)."""

from __future__ import annotations

from django.urls import path
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislock import require_slot


class ExportView(APIView):
    authentication_classes = ()
    permission_classes = ()
    renderer_classes = (JSONRenderer,)

    @require_slot("export:<pk>", limit=2, blocking_timeout=0.05)
    def get(self, request: Request, pk: int) -> Response:
        return Response({"ok": True})


urlpatterns = [path("export/<int:pk>/", ExportView.as_view())]
