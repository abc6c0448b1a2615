"""What the process's background writers share: the counters
(``counters.Tally``) and the per-minute history (``hot.Recorder``).

Each keeps a tally in memory, under a lock, and a daemon thread that writes
it, started by the first count. The thread's lifecycle (started on first use,
reset in a forked child, a failed start reported once and tried again by the
next count, the last write at exit) is ``engine/threads.py``'s. What is
particular to a writer:

- a child of ``fork()`` must neither write its parent's tally nor wait for
  the parent's thread: every entry point asks ``_forked`` first;
- the last write, at exit, cannot be bounded by waiting on a new thread:
  Python 3.12 refuses new threads once it is shutting down. So the
  writing thread, already running, makes it (``close``), on the client
  itself, and the exit waits for it at most ``EXIT_WAIT``: a hung Redis
  delays the exit that long, and its counts are dropped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django_redislock.engine.threads import Lifecycle

logger = logging.getLogger(__name__)

#: Seconds between writes.
FLUSH_SECONDS = 1.0
#: The longest the process's exit waits for one writer's last write.
EXIT_WAIT = 2.0


class BackgroundWriter:
    #: The writing thread's name.
    thread_name = "django-redislock-writer"

    def __init__(self, *, background: bool = True) -> None:
        #: Start the writing thread on the first count (off: only ``flush`` writes).
        self.background = background
        self.reset()
        self._life = Lifecycle(self.thread_name, self.reset, at_exit=self.close)

    def reset(self) -> None:
        """No thread, in this process (a subclass forgets its tally too)."""
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # see ``flush``
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # set by ``close``
        self._closing = False
        self._closed = threading.Event()

    def _forked(self) -> bool:
        """Whether this is a child forked without the hooks: then reset."""
        return self._life.forked()

    def _start(self) -> None:
        """Start the writing thread (``_lock`` held), if it can: counting
        never fails a lock, and the next count tries again."""
        self._thread = self._life.start(self._run)

    def forget_exit(self) -> None:
        """No last write at exit (a writer replaced by another)."""
        self._life.forget_exit()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            self._wake.wait(FLUSH_SECONDS)
            with self._lock:
                if self._thread is not me:  # reset() or stopped: another's now
                    if self._closing and self._thread is None:  # close() raced stop()
                        self._closed.set()
                    return
                closing = self._closing
                if not closing and self._idle():
                    self._thread = None
                    return
            if closing:
                try:
                    self.flush(last=True)
                finally:
                    self._closed.set()
                return
            self.flush()

    def _idle(self) -> bool:
        """Nothing new since the last write: the thread may exit (under ``_lock``)."""
        return False

    def flush(self, *, last: bool = False) -> None:
        """Write what is pending; ``last``: from the writing thread at exit,
        which bounds nothing itself (``close`` stops waiting for it).

        Flushes follow each other (``_flushing``): a reader's flush (``locks
        inspect``, the dashboard) that came while the thread wrote what it
        had just taken returned at once, and the read after it missed them."""
        if self._forked():  # the parent's tally is the parent's to write
            return
        with self._flushing:
            with self._lock:
                taken = self._take()
            if taken:
                self._write(taken, last)

    def _take(self) -> Any:
        """What is pending, now the caller's to write; forgotten here (under ``_lock``)."""
        raise NotImplementedError

    def _write(self, taken: Any, last: bool) -> None:
        """Write ``taken`` (``_take``), best effort: never raises."""
        raise NotImplementedError

    def close(self) -> None:
        """The last write, at exit (``atexit``): made by the writing thread
        where one runs (see the module's docstring), else here."""
        if self._forked():  # the parent's tally is the parent's to write
            return
        with self._lock:
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                self._closing = True
                self._wake.set()
            else:
                thread = None
        if thread is None:
            self.flush()
        elif not self._closed.wait(EXIT_WAIT):
            logger.debug("Gave up on the last write of %s at exit", self.thread_name)
