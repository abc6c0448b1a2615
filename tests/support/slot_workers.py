"""Worker bodies for the ``require_slot`` process tests: a view limited per key,
called by threads of spawned processes as a server's workers would."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_redislock import require_slot
from tests.support.gauge import Gauge

#: The gauge of the running worker process (set before its threads start).
GAUGE: Gauge | None = None


@require_slot("export:<pk>", limit=3, timeout=20, blocking_timeout=90)
def export(request: HttpRequest, pk: int) -> HttpResponse:
    assert GAUGE is not None
    with GAUGE.inside():
        time.sleep(0.02)  # the work: long enough for the others to pile up
    return HttpResponse("ok")


def requests(gauge: Gauge, start: Any, threads: int, statuses: Any) -> None:
    """``threads`` concurrent requests from this process, released together
    with every other worker's by ``start``; each status is counted in ``statuses``."""
    global GAUGE
    GAUGE = gauge

    def one() -> None:
        request = RequestFactory().get("/export/7/")
        start.wait(60)
        response = export(request, pk=7)
        with statuses.get_lock():
            statuses[0 if response.status_code == 200 else 1] += 1

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)


@require_slot("order:<pk>", limit=2, timeout=20, blocking_timeout=60)
def ordered(request: HttpRequest, pk: int, index: int) -> HttpResponse:
    redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"]).rpush("slot-order", index)
    return HttpResponse("ok")


def ordered_request(index: int) -> None:
    response = ordered(RequestFactory().get("/order/1/"), pk=1, index=index)
    assert response.status_code == 200, response.status_code


@require_slot("busy:<pk>", limit=2, timeout=4, blocking_timeout=30)
def held_open(request: HttpRequest, pk: int, inside: Any, done: Any) -> HttpResponse:
    inside.release()  # one more request is in
    done.wait(60)
    return HttpResponse("ok")


def held_open_request(inside: Any, done: Any) -> None:
    """A slow request: holds its slot of ``busy:1`` until ``done`` is set."""
    response = held_open(RequestFactory().get("/busy/1/"), pk=1, inside=inside, done=done)
    assert response.status_code == 200, response.status_code
