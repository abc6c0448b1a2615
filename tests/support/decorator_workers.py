"""Worker bodies for the ``require_lock`` process tests (no models imported)."""

from __future__ import annotations

import json

from django_redislock import require_lock


@require_lock("machine:<machine_id>", blocking_timeout=30)
def merge(machine_id: int, source: str, value: int) -> None:
    """The CMDB story: workers merge data streams into one machine record by
    read-modify-write; without the lock, concurrent merges lose each other's data."""
    from django_redislock.backend.client import get_client

    client = get_client("default")
    key = f"machine-record:{machine_id}"
    record = json.loads(client.get(key) or "{}")
    record.setdefault(source, []).append(value)
    client.set(key, json.dumps(record))


def merge_many(machine_id: int, source: str, rounds: int) -> None:
    for value in range(rounds):
        merge(machine_id, source, value)
