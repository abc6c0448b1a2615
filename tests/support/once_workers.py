"""Worker bodies for the ``@idempotent`` process tests: a client retrying a
purchase with one ``Idempotency-Key``. Imports no models at import time."""

from __future__ import annotations

import json
from typing import Any


def retry_purchase(path: str, keys: list[str], start: Any, atomic_requests: bool) -> None:
    """POST ``path`` once per key in ``keys`` (after ``start``), as a client
    retrying: each answer goes to the Redis list ``once:answers``."""
    from django.conf import settings
    from django.test import Client, override_settings
    from django.test.utils import setup_test_environment

    from django_redislock.backend.client import get_client

    setup_test_environment()
    database = settings.DATABASES["default"]
    database["ATOMIC_REQUESTS"] = atomic_requests
    if atomic_requests and database["ENGINE"].endswith("sqlite3"):
        database["OPTIONS"]["transaction_mode"] = "IMMEDIATE"  # see docs/inventory.md
    client = get_client("default")
    with override_settings(ROOT_URLCONF="tests.support.once_views"):
        http = Client()
        if start is not None:
            start.wait(60)
        for key in keys:
            answer = http.post(path, "{}", content_type="application/json",
                               headers={"Idempotency-Key": key})  # fmt: skip
            replayed = answer.get("Idempotent-Replayed") == "true"
            record = [key, answer.status_code, replayed, answer.content.decode()]
            client.rpush("once:answers", json.dumps(record))
