from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.dispatch import Signal

from django_redislock import LockTimeout


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


def time_out_in_another_thread(name: str, blocking_timeout: float) -> LockTimeout:
    """Hold ``name`` here while another thread waits ``blocking_timeout`` for it
    and gives up (``lock_contended``); returns its ``LockTimeout``."""
    from django_redislock import Lock

    refused: list[LockTimeout] = []

    def contend() -> None:
        try:
            with Lock(name, blocking_timeout=blocking_timeout):
                pass
        except LockTimeout as exc:
            refused.append(exc)

    with Lock(name):
        thread = threading.Thread(target=contend)
        thread.start()
        thread.join(30)
    [error] = refused
    return error
