"""Operators' view of the Once records: idempotency keys and enqueue claims.

Two ``Kind``\\ s beside the primitives' (``kinds.py``), so ``manage.py locks``
and the dashboard list, count, inspect and clear them as they do locks:

- ``idempotency``: a key's record (``once/store.py``), *running* while its
  first request runs, *stored* once its response is kept for replay; its
  holder says what it is (method, path, key, status) and how old;
- ``once``: an enqueue claim (``once/claims.py``), *queued* or *running*, with
  its task and id.

Clearing a record makes the next request with the key run again; clearing a
claim lets the next enqueue through. The key's lock (kind ``lock``, same
name) is cleared with it by ``locks clear NAME``.
"""

from __future__ import annotations

import time
from typing import Any

from django_redislock.backend import client as backend
from django_redislock.backend import family
from django_redislock.backend.values import HolderInfo, number
from django_redislock.context import SEPARATOR
from django_redislock.once import claims, store
from django_redislock.ops.kinds import HeldInfo, confirmed_tokens, unreadable


def _age(since_ms: str | None) -> float | None:
    value = number(since_ms) if since_ms else None
    return None if value is None else max(0.0, time.time() - value / 1000)


def _seconds(age: float | None) -> str:
    return "" if age is None else f", {age:.0f}s old"


class _RecordKind:
    """A Once hash, read with ``HGETALL`` and ``PTTL``, cleared by ``once_clear.lua``."""

    kind = ""
    main_part = ""
    holder_field = ""

    def _read(self, client: Any, key: str) -> tuple[dict[str, str], int] | None:
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.pttl(key)
        try:
            raw, pttl = pipe.execute()
        except family.response_errors() as exc:  # a key of another type, written by hand
            if "WRONGTYPE" not in str(exc):
                raise
            return {}, -1
        if not raw:
            return None
        fields = {backend.as_text(k): backend.as_text(v) for k, v in raw.items()}
        return fields, int(pttl)

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        read = self._read(client, backend.key(prefix, name, self.main_part))
        if read is None:
            return None
        fields, pttl = read
        ttl = pttl / 1000.0 if pttl >= 0 else None
        described = self._describe(fields)
        if described is None:
            return unreadable(name, self.kind, ttl)
        who, text, since_ms, extra = described
        age = _age(since_ms)
        since_number = number(since_ms) if since_ms else None
        since = None if since_number is None else since_number / 1000
        holder = HolderInfo(
            token=fields.get(self.holder_field, ""),
            holder=f"{who}{SEPARATOR}{text}{_seconds(age)}",  # "who | what", as a lock's
            ttl=ttl,
            since=since,
        )
        extra = {**extra, "age": f"{age:.1f}s" if age is not None else "-"}
        return HeldInfo(name=name, kind=self.kind, holders=[holder], extra=extra)

    def _describe(
        self, fields: dict[str, str]
    ) -> tuple[str, str, str | None, dict[str, Any]] | None:
        """Who, what, since when (ms) and the extra fields; ``None``: unreadable."""
        raise NotImplementedError

    def clear(
        self, client: Any, prefix: str, name: str, *, confirmed: HeldInfo | None = None
    ) -> int:
        from django_redislock.backend.scripts import ONCE_CLEAR

        keys = ONCE_CLEAR.keys_of({"record": backend.key(prefix, name, self.main_part)})
        args = ONCE_CLEAR.args_of(field=self.holder_field, confirmed=confirmed_tokens(confirmed))
        return int(ONCE_CLEAR(client, keys, args))


class IdempotencyKind(_RecordKind):
    kind = "idempotency"
    main_part = store.PART
    holder_field = "owner"

    def _describe(
        self, fields: dict[str, str]
    ) -> tuple[str, str, str | None, dict[str, Any]] | None:
        state = fields.get("state")
        if state not in ("running", "done"):
            return None
        what = (
            f"{fields.get('method', '?')} {fields.get('path', '?')} key {fields.get('key', '?')!r}"
        )
        user = f"user {fields['user']}" if fields.get("user") else "anonymous"
        if state == "done":
            text = f"stored {fields.get('status', '?')}: {what}"
            since = fields.get("stored")
        else:
            text = f"in flight: {what}"
            since = fields.get("started")
        extra = {"state": "stored" if state == "done" else "in flight", "user": user}
        return user, text, since, extra


class OnceKind(_RecordKind):
    kind = "once"
    main_part = claims.PART
    holder_field = "token"

    def _describe(
        self, fields: dict[str, str]
    ) -> tuple[str, str, str | None, dict[str, Any]] | None:
        state = fields.get("state")
        if state not in ("queued", "running"):
            return None
        task_id = fields.get("id") or "unknown"
        text = f"{state}: task {fields.get('task') or '?'}"
        return f"id {task_id}", text, fields.get("since"), {"state": state, "task_id": task_id}
