"""What ``@idempotent`` answers a request it does not run: 400, 409, 422.

Plain text, or ``{"detail": ..., "code": ...}`` JSON for Django REST framework
views, as ``@require_lock``'s answers are (``responses.is_drf``), each with
its code in the ``Redislock-Error`` header: a client tells the key's 409 (retry
soon) and 422 (a client bug) from the view's own by it.
"""

from __future__ import annotations

import importlib
import sys
from http import HTTPStatus
from typing import Any, cast

from django.http import HttpResponse, HttpResponseBase, JsonResponse

from django_redislock import responses
from django_redislock.once.attempts import HEADER

#: ``Retry-After`` (seconds) of the 409 sent while the first request with the key runs.
RUNNING_RETRY_AFTER = 1
#: The codes of these answers (``Redislock-Error``, and the JSON's ``code``).
KEY_MISSING = "idempotency_key_missing"
KEY_MALFORMED = "idempotency_key_malformed"
KEY_IN_USE = "idempotency_key_in_use"
KEY_MISMATCH = "idempotency_key_mismatch"
#: Says why a response was not stored (``streaming``, ``too large``): a retry runs again.
NOT_STORED_HEADER = "Idempotent-Not-Stored"


def error(
    request: Any, status: int, message: str, code: str, retry_after: int | None = None
) -> HttpResponseBase:
    headers = {responses.CODE_HEADER: code}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    view = getattr(getattr(request, "resolver_match", None), "func", None)
    if not responses.is_drf(request, view):
        return HttpResponse(
            f"{message}\n", status=status, content_type="text/plain; charset=utf-8", headers=headers
        )
    drf_request = sys.modules["rest_framework.request"].Request
    if isinstance(request, drf_request):  # inside APIView.dispatch: the view's renderers
        response = importlib.import_module("rest_framework.response").Response
        body = {"detail": message, "code": code}
        return cast(HttpResponseBase, response(body, status=status, headers=headers))
    return JsonResponse({"detail": message, "code": code}, status=status, headers=headers)


def missing(request: Any) -> HttpResponseBase:
    message = f"This request needs an {HEADER} header."
    return error(request, HTTPStatus.BAD_REQUEST, message, KEY_MISSING)


def malformed(request: Any, problem: str) -> HttpResponseBase:
    return error(request, HTTPStatus.BAD_REQUEST, problem, KEY_MALFORMED)


def running(request: Any) -> HttpResponseBase:
    message = f"A request with this {HEADER} is still being processed; retry shortly."
    return error(request, HTTPStatus.CONFLICT, message, KEY_IN_USE, RUNNING_RETRY_AFTER)


def mismatch(request: Any) -> HttpResponseBase:
    message = f"This {HEADER} was used with a different request body."
    return error(request, HTTPStatus.UNPROCESSABLE_ENTITY, message, KEY_MISMATCH)
