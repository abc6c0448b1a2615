"""Views and URLs for the Locks panel's tests (``tests/test_debug_toolbar.py``).

A module of its own: the toolbar's URLs import its models, which exist only
once a test has put ``debug_toolbar`` in ``INSTALLED_APPS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path
from django_redis import get_redis_connection

from django_redislock import (
    AsyncLock,
    AsyncSemaphore,
    Lock,
    LockBackendError,
    LockLostError,
    ReadWriteLock,
    Semaphore,
)
from django_redislock.signals import lock_lost

EVIL = "<b>sku</b>:42"


def locks_view(request: HttpRequest) -> HttpResponse:
    """A lock and a permit (both fenced up front), a read lock, a lock another thread holds
    (timed out, then refused) and a lock on a Redis that is down."""
    with Lock(EVIL, fencing=True):
        pass
    with Semaphore("exports:7", 3, fencing=True):
        pass
    with ReadWriteLock("catalog").read():
        pass
    timed_out = Lock("report:daily", blocking_timeout=0.3).acquire()
    refused = Lock("report:daily").acquire(blocking=False)
    try:
        Lock("sku:down", using="down").acquire(blocking=False)
    except LockBackendError:
        down = True
    else:
        down = False
    assert not (timed_out or refused) and down
    return HttpResponse("<html><body><h1>Shop</h1></body></html>")


def lost_view(request: HttpRequest) -> HttpResponse:
    """Two leases cleared while held: one found gone by its release (the
    request's thread), one by the watchdog's renewal (a thread of its own)."""
    client = get_redis_connection("default")
    found_by_watchdog = threading.Event()

    def watchdog_found(sender: Any, name: str, **kwargs: Any) -> None:
        if name == "gone:renewed":
            found_by_watchdog.set()

    with contextlib.suppress(LockLostError), Lock("gone:released", auto_renew=False):
        client.delete("redislock:{gone:released}:lock")
    lock_lost.connect(watchdog_found, weak=False)
    try:
        with contextlib.suppress(LockLostError), Lock("gone:renewed", timeout=1):
            client.delete("redislock:{gone:renewed}:lock")
            assert found_by_watchdog.wait(10)
    finally:
        lock_lost.disconnect(watchdog_found)
    return HttpResponse("<html><body>lost</body></html>")


def capped_view(request: HttpRequest) -> HttpResponse:
    """A hold the watchdog stopped renewing at its ``max_hold``."""
    told = threading.Event()
    with (
        contextlib.suppress(LockLostError),
        Lock("gone:capped", timeout=0.6, max_hold=0.5, on_lost=lambda hold: told.set()),
    ):
        assert told.wait(10)
    return HttpResponse("<html><body>capped</body></html>")


async def async_view(request: HttpRequest) -> HttpResponse:
    """An async view whose tasks each take a permit, under an ``AsyncLock``."""

    async def export(n: int) -> None:
        async with AsyncSemaphore("exports:async", 2):
            await asyncio.sleep(0)

    async with AsyncLock("cart:async"):
        await asyncio.gather(*(export(n) for n in range(3)))
    return HttpResponse("<html><body>async</body></html>")


def idle_view(request: HttpRequest) -> HttpResponse:
    with Lock("sku:1"):
        return HttpResponse("<html><body>ok</body></html>")


def _urls() -> list[URLPattern | URLResolver]:
    from debug_toolbar.toolbar import debug_toolbar_urls

    return [
        path("locks/", locks_view),
        path("idle/", idle_view),
        path("lost/", lost_view),
        path("capped/", capped_view),
        path("async/", async_view),
        *debug_toolbar_urls(),
    ]


urlpatterns = _urls()
