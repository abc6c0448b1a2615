"""What the process's background writers share: the counters
(``counters.Tally``) and the per-minute history (``hot.Recorder``).

Each keeps a tally in memory, under a lock, and a daemon thread that writes
it, started by the first count. Two things are easy to get wrong, and were,
once per copy:

- a thread that cannot start (the process's thread, pid or memory limit)
  must not be recorded as started, or nothing is written again and the
  tally grows for good: the next count tries again;
- a child of ``fork()`` must neither write its parent's tally nor wait for
  the parent's thread. ``os.register_at_fork`` resets it where Python's hooks
  run; ``_forked`` catches a child made by C's ``fork()`` without them
  (uWSGI without ``py-call-osafterfork``), before taking a lock a parent's
  thread may have held.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)


class BackgroundWriter:
    #: The writing thread's name.
    thread_name = "django-redislock-writer"

    def __init__(self, *, background: bool = True) -> None:
        #: Start the writing thread on the first count (off: only ``flush`` writes).
        self.background = background
        self.reset()

    def reset(self) -> None:
        """No thread, in this process (a subclass forgets its tally too)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _forked(self) -> bool:
        """Whether this is a child forked without the hooks: then reset."""
        if self._pid == os.getpid():
            return False
        self.reset()
        return True

    def _start(self) -> None:
        """Start the writing thread (``_lock`` held), if it can: counting
        never fails a lock, and the next count tries again."""
        thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread"
            logger.warning("Could not start the %s thread", self.thread_name, exc_info=True)
            return
        self._thread = thread

    def _run(self) -> None:
        raise NotImplementedError
