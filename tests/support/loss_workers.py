"""Worker processes for the loss-hook tests (``tests/holds/test_loss_hooks.py``)."""

from __future__ import annotations

import threading
from typing import Any


def hold_until_told(name: str, events: Any, replies: Any) -> None:
    """Hold ``name`` (0.6 s lease, renewed) with an ``on_lost`` callback; say
    when held; then wait for the callback and report what the hold said."""
    from django_redislock import Lock, LockLostError

    told = threading.Event()
    calls: list[tuple[str, bool]] = []

    def on_lost(hold: Any) -> None:
        calls.append((threading.current_thread().name, hold.lost))
        told.set()

    lock = Lock(name, timeout=0.6, on_lost=on_lost)
    try:
        with lock:
            events.put("held")
            if not told.wait(15):
                replies.put({"told": False})
                return
            try:
                lock.check()
                checked = "no error"
            except LockLostError as exc:
                checked = str(exc)
            report = {"told": True, "lost": lock.lost, "check": checked, "calls": list(calls)}
    except LockLostError as exc:
        report["exit"] = str(exc)
    replies.put(report)
