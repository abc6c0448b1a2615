"""Views for the ``require_slot`` tests (``ROOT_URLCONF`` is overridden to this module)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import AsyncSemaphore, Semaphore, require_slot


def _holders(name: str) -> dict[str, Any]:
    return {"name": name, "holders": len(Semaphore(name, 2).holders())}


@require_slot("export:<pk>", limit=2, blocking_timeout=0.05)
def export(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_holders(f"export:{pk}"))


@require_slot("export:<pk>", limit=2, blocking_timeout=0.05, on_contention=503)
def export_503(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_holders(f"export:{pk}"))


@require_slot("export:<pk>", limit=2)
def boom(request: HttpRequest, pk: int) -> HttpResponse:
    raise RuntimeError("the view failed")


class DirectView(View):
    @require_slot("export:<pk>", limit=2, blocking_timeout=0.05)
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_holders(f"export:{pk}"))


@method_decorator(require_slot("export:<pk>", limit=2, blocking_timeout=0.05), name="dispatch")
class DecoratedView(View):
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return JsonResponse(_holders(f"export:{kwargs['pk']}"))


@require_slot("export:<pk>", limit=2, blocking_timeout=0.05)
async def export_async(request: HttpRequest, pk: int) -> HttpResponse:
    holders = await AsyncSemaphore(f"export:{pk}", 2).holders()
    return JsonResponse({"name": f"export:{pk}", "holders": len(holders)})


urlpatterns = [
    path("export/<int:pk>/", export),
    path("export-503/<int:pk>/", export_503),
    path("boom/<int:pk>/", boom),
    path("direct/<int:pk>/", DirectView.as_view()),
    path("decorated/<int:pk>/", DecoratedView.as_view()),
    path("async/<int:pk>/", export_async),
]
