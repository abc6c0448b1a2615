from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.dispatch import Signal


@contextmanager
def capture(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """Record every send of ``signal`` while the block runs."""
    calls: list[dict[str, Any]] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        calls.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)
