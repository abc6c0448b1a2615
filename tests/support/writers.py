"""The background writer (``counters.TALLY``) in tests."""

from __future__ import annotations

from typing import Any


def drain(writer: Any, *, background: bool | None = None) -> None:
    """Forget ``writer``'s tally and wait for its writing thread to end.

    ``reset()`` alone left a thread that had just taken its tally to write it
    whenever it came to: into the next test's Redis, after that test's
    ``FLUSHALL``. A test must never depend on when a background flush lands.
    """
    thread = writer._thread
    writer.reset()
    if background is not None:
        writer.background = background
    if thread is not None:
        thread.join(10)  # it sees it was replaced at its next wake (FLUSH_SECONDS)
        assert not thread.is_alive(), f"{writer.thread_name} never ended"
