"""Where ``@idempotent`` keeps an attempt and its response: one Redis hash per key.

``<prefix>:{idempotency:<digest>}:idempotency`` holds ``state`` (``running``
while the first request runs, ``done`` once its response is stored), the
attempt's ``owner`` token and body ``fingerprint``, what it was (``key``,
``user``, ``method``, ``path``, for operators), and once done the response:
``status``, ``reason``, ``headers`` (JSON) and ``body`` (base64, so a client
with ``decode_responses`` reads it too). Only the holder of the key's lock
writes it, and the final write (or the drop) is compared with ``owner`` in
the script that makes it: an attempt whose lock was lost cannot overwrite
the retry that took over.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse, HttpResponseBase

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.once.attempts import Attempt

#: The record's key part; operators list records by it (``ops/once.py``).
PART = "idempotency"
RUNNING, DONE = "running", "done"
#: Headers never replayed: a cookie belongs to the response that set it.
_NOT_REPLAYED = frozenset({"set-cookie"})
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Snapshot:
    """A response as stored: replayed byte for byte."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    @classmethod
    def of(cls, response: HttpResponse) -> Snapshot:
        headers = [(k, v) for k, v in response.items() if k.lower() not in _NOT_REPLAYED]
        return cls(response.status_code, response.reason_phrase, headers, response.content)

    def fields(self) -> dict[str, str]:
        return {
            "status": str(self.status),
            "reason": self.reason,
            "headers": json.dumps(self.headers),
            "body": base64.b64encode(self.body).decode("ascii"),
        }

    def replay(self) -> HttpResponseBase:
        response = HttpResponse(self.body, status=self.status, reason=self.reason)
        for name, value in self.headers:
            response[name] = value
        response[REPLAYED_HEADER] = "true"
        return response


@dataclass(frozen=True)
class Record:
    state: str
    fingerprint: str
    snapshot: Snapshot | None


def parse(raw: dict[Any, Any]) -> Record | None:
    """A record as read by ``HGETALL`` (``None``: no record, or unreadable)."""
    fields = {backend.as_text(k): backend.as_text(v) for k, v in raw.items()}
    state = fields.get("state")
    if state not in (RUNNING, DONE):
        return None
    snapshot = None
    if state == DONE:
        try:
            snapshot = Snapshot(
                int(fields["status"]),
                fields.get("reason", ""),
                [(str(k), str(v)) for k, v in json.loads(fields.get("headers", "[]"))],
                base64.b64decode(fields.get("body", "")),
            )
        except (KeyError, ValueError, TypeError):
            return None  # written by hand: as if absent
    return Record(state, fields.get("fingerprint", ""), snapshot)


class Store:
    """The records of one cache alias, for ``@idempotent``'s calls."""

    def __init__(self, using: str | None, ttl: float) -> None:
        self.using = using
        self.ttl_ms = max(1, round(ttl * 1000))

    @contextmanager
    def _client(self, name: str) -> Iterator[tuple[Any, str]]:
        """The client and the record's key; Redis failures as ``LockBackendError``."""
        with backend.translate_errors(name):
            settings = get_settings()
            alias = self.using or settings.cache
            prefix = backend.namespace(alias, settings.key_prefix)
            yield backend.get_client(alias), backend.key(prefix, name, PART)

    def read(self, name: str) -> Record | None:
        with self._client(name) as (client, key):
            return parse(client.hgetall(key))

    def begin(self, attempt: Attempt, owner: str) -> None:
        """Mark the key running (under its lock), replacing what a dead attempt left."""
        fields = {
            "state": RUNNING,
            "owner": owner,
            "fingerprint": attempt.fingerprint,
            "key": attempt.key,
            "user": attempt.user,
            "method": attempt.method,
            "path": attempt.path,
            "started": str(int(time.time() * 1000)),
        }
        with self._client(attempt.name) as (client, key):
            pipe = client.pipeline(transaction=True)
            pipe.delete(key)
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, self.ttl_ms)
            pipe.execute()

    def settle(self, attempt: Attempt, owner: str, snapshot: Snapshot | None) -> bool:
        """Store ``snapshot`` as the key's response (``None``: drop the
        record, so a retry runs again); whether it was still this attempt's."""
        from django_redislock.backend.scripts import IDEMPOTENCY_SETTLE

        args = IDEMPOTENCY_SETTLE.args_of(
            owner=owner, ttl_ms=0 if snapshot is None else self.ttl_ms
        )
        if snapshot is not None:
            fields = {
                "state": DONE,
                "owner": owner,
                "fingerprint": attempt.fingerprint,
                "key": attempt.key,
                "user": attempt.user,
                "method": attempt.method,
                "path": attempt.path,
                "stored": str(int(time.time() * 1000)),
                **snapshot.fields(),
            }
            args += [item for pair in fields.items() for item in pair]
        with self._client(attempt.name) as (client, key):
            return bool(
                IDEMPOTENCY_SETTLE(client, IDEMPOTENCY_SETTLE.keys_of({"record": key}), args)
            )
