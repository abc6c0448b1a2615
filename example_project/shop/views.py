from __future__ import annotations

import math
import re
import time

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from django_redislock import (
    InsufficientStock,
    LockBackendError,
    LockTimeout,
    Semaphore,
    idempotent,
    require_lock,
    require_slot,
)

from . import load
from .models import SKU, Order

#: Longest simulated payment a buyer may ask for (``think_ms``), in ms.
MAX_THINK_MS = 2000

#: How long rendering an invoice takes (a PDF renderer would take longer).
INVOICE_RENDER_SECONDS = 0.5


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/index.html", {"skus": SKU.objects.all()})


@require_POST
@idempotent()
@require_lock("sku:<pk>")
def buy(request: HttpRequest, pk: int) -> HttpResponse:
    """One purchase. A client that sends an ``Idempotency-Key`` and retries
    (a double click, a lost answer) buys once: the retry gets the first
    answer replayed, or 409 while it still runs (docs/once.md).
    The view lock serialises buyers of this SKU (a second
    buyer waits up to BLOCKING_TIMEOUT, then gets 423 with Retry-After);
    ``deduct()`` guards the stock itself, until the order is committed.
    Redis failing part way (``LockBackendError`` from ``deduct()``) rolls the
    purchase back and answers 503, as ``@require_lock`` does for its own lock."""
    return purchase(request, pk)


@require_lock("sku:<pk>")
async def abuy(request: HttpRequest, pk: int) -> HttpResponse:
    """``buy`` as an async view (under ASGI): the view lock is an
    ``AsyncLock``, and its waiters wait as tasks on the worker's event loop,
    on the process's shared wake-up connection, without a thread each; the
    purchase itself (the ORM) runs in a thread."""
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    return await sync_to_async(purchase)(request, pk)


def purchase(request: HttpRequest, pk: int) -> HttpResponse:
    """The purchase of ``buy`` and ``abuy``, under their lock."""
    sku = get_object_or_404(SKU, pk=pk)
    buyer = request.user.get_username() if request.user.is_authenticated else "guest"
    think = request.POST.get("think_ms", "")
    think_ms = min(int(think), MAX_THINK_MS) if re.fullmatch(r"[0-9]{1,5}", think) else 0
    try:
        with transaction.atomic():
            if think_ms:  # a slow payment provider that takes two calls at a time
                # (a wait longer than the longest payment: a busy slot frees in time)
                with Semaphore(
                    "payment-provider", 2, timeout=10, blocking_timeout=MAX_THINK_MS / 500
                ):
                    time.sleep(think_ms / 1000)
            sku.deduct(1)
            Order.objects.create(sku=sku, quantity=1, buyer=buyer)
    except InsufficientStock:
        messages.error(request, f"Sorry, {sku.title} is sold out.")
        outcome = load.SOLD_OUT
    except LockBackendError:  # Redis went away mid-purchase: nothing was sold (rolled back)
        # before LockTimeout: a LockBackendTimeout (Redis stopped answering) is both
        return HttpResponse(
            "The lock service is unavailable; nothing was bought. Try again shortly.\n",
            status=503,
            headers={"Retry-After": "5"},
        )
    except LockTimeout as exc:  # the payment provider stayed busy: try again shortly
        response = HttpResponse("The payment provider is busy; try again.", status=503)
        response["Retry-After"] = str(max(1, math.ceil(exc.retry_after or 1)))
        return response
    else:
        messages.success(request, f"Bought one {sku.title}; {sku.stock} left.")
        outcome = load.BOUGHT
    response = redirect("shop:index")
    response[load.OUTCOME_HEADER] = outcome  # for shop_load's tally
    return response


def orders(request: HttpRequest) -> HttpResponse:
    recent = Order.objects.select_related("sku")[:100]
    return render(request, "shop/orders.html", {"orders": recent})


@login_required(login_url="admin:login")  # first: an anonymous request takes no slot
@require_slot("invoice:<request.user.pk>", limit=2, blocking_timeout=1)
def invoice(request: HttpRequest, pk: int) -> HttpResponse:
    """An order's invoice, as a download. Rendering one is slow, so each user
    renders at most two at once, across every server: a third download waits
    up to a second for a slot, then gets 429 with Retry-After. Other users
    are not held up. The slot is released when the view returns."""
    order = get_object_or_404(Order.objects.select_related("sku"), pk=pk)
    if not request.user.is_staff and order.buyer != request.user.get_username():
        raise Http404("No such order.")
    time.sleep(INVOICE_RENDER_SECONDS)  # the renderer
    lines = [
        f"Invoice for order #{order.pk}",
        f"Date: {order.created_at:%Y-%m-%d %H:%M:%S %Z}",
        f"Buyer: {order.buyer or '-'}",
        f"{order.quantity} x {order.sku.title} ({order.sku.code}) at {order.sku.price}",
        f"Total: {order.quantity * order.sku.price}",
    ]
    response = HttpResponse("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="invoice-{order.pk}.txt"'
    return response


@require_POST
def start_load(request: HttpRequest) -> HttpResponse:
    """The shop page's button: ``shop_load`` for a minute, inside this server."""
    try:
        started = load.start_in_background(seconds=60, buyers=8)
    except LockBackendError as exc:
        messages.error(request, f"Redis is unreachable, so no load run: {exc}")
        return redirect("shop:index")
    if started:
        dashboard = reverse("admin:django_redislock_heldlock_changelist")
        messages.success(
            request,
            format_html(
                '8 buyers are shopping for 60 s: watch <a href="{}">the lock dashboard</a>.',
                dashboard,
            ),
        )
    else:
        messages.info(request, "A load run is already going.")
    return redirect("shop:index")
