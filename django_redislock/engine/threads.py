"""One lifecycle for every background thread of the package.

The package runs five kinds of background thread: the watchdog's scheduler and
lanes (``holds/watchdog.py``, ``holds/lanes.py``), the writer of the counters and history
(``holds/counters.py``), the janitor that re-sends clean-ups (``engine/janitor.py``),
the worker pools that bound a command by a deadline and run Redlock's per-server
calls (``engine/workers.py``) and the shared wake-up connections of the waiters
(``engine/wakeups.py``). Each must get
the same four things right, and each copy once got one of them wrong, so they
are written here once:

- **start on first use**: an owner starts a thread when work arrives and none
  runs (``start``), never at import;
- **reset after** ``fork()``: a child must neither use its parent's threads nor
  a lock one of them held at the fork. ``os.register_at_fork`` resets the owner
  where Python's hooks run; ``forked`` catches a child made by C's ``fork()``
  without them (uWSGI without ``py-call-osafterfork``), and an owner asks it
  first, before taking any lock of its own;
- **a failed start reported once**: a thread that cannot start (the process's
  thread, pid or memory limit) is not recorded as started, so the next use
  tries again; the refusal is logged at WARNING once, then at DEBUG until a
  thread starts again, because every use tries, and a process at its limit
  would otherwise log a traceback per acquire exactly when its logs matter;
- **stop at exit**: an owner with a last duty (a final write, clean-ups still
  to send) names it as ``at_exit``; it runs at interpreter exit in the process
  that made the owner, never in a forked child.

Every thread is a daemon: one left waiting on a hung Redis must not hold up the
process's exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class Lifecycle:
    """The process-bound part of one background worker (see the module's docstring).

    ``reset`` empties the owner (no thread, nothing pending) in a forked child;
    ``hook_fork=False`` for owners made and dropped at run time (a pool per
    server), which their long-lived parent resets instead: a fork hook is never
    unregistered, so it would keep each of them alive for good.
    """

    def __init__(
        self,
        name: str,
        reset: Callable[[], None],
        *,
        at_exit: Callable[[], None] | None = None,
        hook_fork: bool = True,
    ) -> None:
        self.name = name
        self._reset = reset
        self._refused = False
        self.pid = os.getpid()
        if hook_fork and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork)
        if at_exit is not None:
            atexit.register(self._exit, at_exit)

    def after_fork(self) -> None:
        """In a forked child: this process's now, with no thread."""
        self.pid = os.getpid()
        self._refused = False
        self._reset()

    def forked(self) -> bool:
        """Whether this is a child forked without the hooks; then reset it first."""
        if self.pid == os.getpid():
            return False
        self.after_fork()
        return True

    def start(
        self, target: Callable[..., Any], *args: Any, name: str | None = None
    ) -> threading.Thread | None:
        """Start a daemon thread running ``target(*args)``; ``None`` if none can
        start (reported once, see the module's docstring): the caller records
        nothing, so its next use tries again."""
        thread = threading.Thread(target=target, args=args, name=name or self.name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread"
            level = logging.DEBUG if self._refused else logging.WARNING
            logger.log(level, "Could not start the %s thread", name or self.name, exc_info=True)
            self._refused = True
            return None
        self._refused = False
        return thread

    def forget_exit(self) -> None:
        """Drop the duty at exit (an owner replaced by another)."""
        atexit.unregister(self._exit)

    def _exit(self, at_exit: Callable[[], None]) -> None:
        if self.pid == os.getpid():  # a child forked without the hooks has nothing to finish
            at_exit()
