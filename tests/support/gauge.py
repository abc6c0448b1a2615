"""A cross-process gauge: how many workers are inside a section right now, and the peak.

Built on shared memory from the ``spawn`` context, so worker processes started
by ``tests.support.procs`` update the same counters as the test that reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.procs import CTX


class Gauge:
    def __init__(self) -> None:
        self._lock = CTX.Lock()
        self._now = CTX.Value("i", 0, lock=False)
        self._peak = CTX.Value("i", 0, lock=False)
        self._entries = CTX.Value("i", 0, lock=False)

    @contextmanager
    def inside(self) -> Iterator[int]:
        """Count this worker in for the block; yields how many are inside, itself included."""
        with self._lock:
            self._now.value += 1
            self._entries.value += 1
            current = self._now.value
            self._peak.value = max(self._peak.value, current)
        try:
            yield current
        finally:
            with self._lock:
                self._now.value -= 1

    @property
    def peak(self) -> int:
        return int(self._peak.value)

    @property
    def entries(self) -> int:
        return int(self._entries.value)

    @property
    def now(self) -> int:
        return int(self._now.value)
