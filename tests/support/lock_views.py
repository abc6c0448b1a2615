"""Views for the ``require_lock`` tests (``ROOT_URLCONF`` is overridden to this module)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import AsyncLock, Lock, require_lock


def _locked_state(name: str) -> dict[str, Any]:
    return {"name": name, "locked": Lock(name).locked()}


@require_lock("sku:<pk>", blocking_timeout=0.05)
def buy(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_locked_state(f"sku:{pk}"))


@require_lock("sku:<pk>", blocking_timeout=0.05, on_contention=503)
def buy_503(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_locked_state(f"sku:{pk}"))


def _sold_out(request: HttpRequest, error: Any) -> HttpResponse:
    return HttpResponse(f"busy: {error.name}", status=409)


@require_lock("sku:<pk>", blocking_timeout=0.05, on_contention=_sold_out)
def buy_custom(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_locked_state(f"sku:{pk}"))


@require_lock("sku:<pk>", blocking_timeout=0.05, on_contention="raise")
def buy_raise(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_locked_state(f"sku:{pk}"))


@require_lock("code:<code>", blocking_timeout=0.05)
def by_code(request: HttpRequest, code: str) -> HttpResponse:
    return JsonResponse(_locked_state(f"code:{code}"))


@require_lock("sku:<pk>")
def boom(request: HttpRequest, pk: int) -> HttpResponse:
    raise RuntimeError("the view failed")


class DirectView(View):
    @require_lock("sku:<pk>", blocking_timeout=0.05)
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_locked_state(f"sku:{pk}"))


@method_decorator(require_lock("sku:<pk>", blocking_timeout=0.05), name="dispatch")
class DecoratedView(View):
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return JsonResponse(_locked_state(f"sku:{kwargs['pk']}"))


class SelfAttributeView(View):
    @method_decorator(require_lock("sku:<self.kwargs.pk>", blocking_timeout=0.05))
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return JsonResponse(_locked_state(f"sku:{kwargs['pk']}"))


@require_lock("sku:<pk>", blocking_timeout=0.05)
async def buy_async(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"name": f"sku:{pk}", "locked": await AsyncLock(f"sku:{pk}").locked()})


urlpatterns = [
    path("buy/<int:pk>/", buy),
    path("buy-503/<int:pk>/", buy_503),
    path("buy-custom/<int:pk>/", buy_custom),
    path("buy-raise/<int:pk>/", buy_raise),
    path("code/<str:code>/", by_code),
    path("boom/<int:pk>/", boom),
    path("direct/<int:pk>/", DirectView.as_view()),
    path("decorated/<int:pk>/", DecoratedView.as_view()),
    path("self/<int:pk>/", SelfAttributeView.as_view()),
    path("async/<int:pk>/", buy_async),
]


def deduct_view(request: HttpRequest, pk: int) -> HttpResponse:
    """One order: deduct, then record it; under ATOMIC_REQUESTS both are one transaction."""
    from django_redislock import InsufficientStock
    from tests.models import Item, Order

    item = Item.objects.get(pk=pk)
    try:
        left = item.deduct(1)
    except InsufficientStock as exc:
        return JsonResponse({"available": exc.available}, status=409)
    Order.objects.create(item=item, quantity=1)
    return JsonResponse({"left": left})


urlpatterns.append(path("deduct/<int:pk>/", deduct_view))


@require_lock("sku:<pk>", blocking_timeout=0.05, on_backend_error=500)
def down_500(request: HttpRequest, pk: int) -> HttpResponse:
    raise AssertionError("the view must not run without its lock")


def _down(request: HttpRequest, error: Any) -> HttpResponse:
    return HttpResponse(f"down: {error.name}", status=502)


@require_lock("sku:<pk>", blocking_timeout=0.05, on_backend_error=_down)
def down_custom(request: HttpRequest, pk: int) -> HttpResponse:
    raise AssertionError("the view must not run without its lock")


@require_lock("sku:<pk>", blocking_timeout=0.05, on_backend_error="raise")
def down_raise(request: HttpRequest, pk: int) -> HttpResponse:
    raise AssertionError("the view must not run without its lock")


@require_lock("sku:<pk>", timeout=8, blocking_timeout=0.05)
def short_lease(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(_locked_state(f"sku:{pk}"))


urlpatterns += [
    path("down-500/<int:pk>/", down_500),
    path("down-custom/<int:pk>/", down_custom),
    path("down-raise/<int:pk>/", down_raise),
    path("short-lease/<int:pk>/", short_lease),
]
