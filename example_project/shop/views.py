from __future__ import annotations

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from django_redislock import InsufficientStock, require_lock

from .models import SKU, Order


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/index.html", {"skus": SKU.objects.all()})


@require_POST
@require_lock("sku:<pk>")
def buy(request: HttpRequest, pk: int) -> HttpResponse:
    """One purchase. The view lock serialises buyers of this SKU (a second
    buyer waits up to BLOCKING_TIMEOUT, then gets 423 with Retry-After);
    ``deduct()`` guards the stock itself, until the order is committed."""
    sku = get_object_or_404(SKU, pk=pk)
    buyer = request.user.get_username() if request.user.is_authenticated else "guest"
    try:
        with transaction.atomic():
            sku.deduct(1)
            Order.objects.create(sku=sku, quantity=1, buyer=buyer)
    except InsufficientStock:
        messages.error(request, f"Sorry, {sku.title} is sold out.")
    else:
        messages.success(request, f"Bought one {sku.title}; {sku.stock} left.")
    return redirect("shop:index")


def orders(request: HttpRequest) -> HttpResponse:
    recent = Order.objects.select_related("sku")[:100]
    return render(request, "shop/orders.html", {"orders": recent})
