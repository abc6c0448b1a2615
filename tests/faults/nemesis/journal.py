"""Append-only logs: one file per worker process, one for the nemesis.

Every line is one JSON object with an ``ev`` (event) and ``t`` (``time.monotonic()``,
which on Linux is one clock for every process of the machine), written with a
single ``write`` and ``fsync``'d before the writer goes on: a line in the file is
something that happened, even if the process was SIGKILLed right after.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def now() -> float:
    return time.monotonic()


class Journal:
    """One process's log file; safe to write from several threads (the watchdog's
    ``lock_lost`` receivers write from theirs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": now(), **fields}, separators=(",", ":")) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a log (a process killed mid-write leaves a partial
    last line, which never happened as far as the checker is concerned)."""
    with path.open("rb") as stream:
        for raw in stream:
            if raw.endswith(b"\n"):
                yield json.loads(raw)
