"""The janitor: one daemon thread that delivers the clean-ups of abandoned attempts.

A command an acquire gave up on (``engine/bounds.py``) may still run when Redis
wakes up, so the attempt's clean-up (a Lock's cancel script, leaving a queue)
is handed to the janitor, which sends it after the abandoned command (on
another connection, so Redis runs it after the one it had already received)
and retries until Redis answers or ``CLEANUP_PATIENCE`` runs out. A command
left running on a worker thread may not even be sent yet: its clean-up waits
until it ended. The caller never waits for a clean-up: it cannot outlive the
acquire's deadline that way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from django_redislock.backend import client as backend
from django_redislock.engine.bounds import within
from django_redislock.engine.threads import Lifecycle

if TYPE_CHECKING:
    from django_redislock.engine.steps import Call

logger = logging.getLogger(__name__)

#: How long the janitor keeps trying to deliver one clean-up; by then leases
#: and waiter deadlines have ended what it would have undone.
CLEANUP_PATIENCE = 120.0
#: The janitor's own socket timeout, and its pause after a failed round.
CLEANUP_TIMEOUT = 2.0
CLEANUP_RETRY_DELAY = 0.5
#: The longest the process's exit waits for clean-ups still to be sent.
CLEANUP_AT_EXIT = 2.0

#: A clean-up: the client, the call, until when to try, the command it must follow.
_Cleanup = tuple[Any, "Call", float, "concurrent.futures.Future[Any] | None"]


class Janitor:
    """One daemon thread that delivers clean-ups of abandoned attempts.

    Started by the first ``submit``; exits once it has nothing left. After
    ``fork()`` the child starts empty: its parent delivers its own clean-ups.
    """

    def __init__(self) -> None:
        self._reset()
        self._life = Lifecycle("django-redislock-janitor", self._reset, at_exit=self.drain_at_exit)

    def _reset(self) -> None:
        """The child starts empty, with a new lock: one held by the parent's
        janitor thread at ``fork()`` would never be released in the child."""
        self._lock = threading.Lock()
        self._pending: collections.deque[_Cleanup] = collections.deque()
        self._thread: threading.Thread | None = None
        self._dropped = 0  # how many times ``drop_pending`` ran

    def drain_at_exit(self) -> None:
        """At exit: wait for the clean-ups still to be sent, at most
        ``CLEANUP_AT_EXIT`` (the thread is a daemon: a short script that
        cancelled an acquire would otherwise exit before its clean-up)."""
        self.wait_idle(CLEANUP_AT_EXIT)

    def submit(
        self, client: Any, call: Call, after: concurrent.futures.Future[Any] | None = None
    ) -> None:
        """Send ``call`` on ``client`` (the cache's sync client) in the background,
        once the abandoned command ``after`` (a worker's, see ``Abandoned``) ended."""
        self._life.forked()  # without the hooks: the parent's thread is not here
        with self._lock:
            self._pending.append((client, call, time.monotonic() + CLEANUP_PATIENCE, after))
            if self._thread is None:  # none started: the next submit tries again
                self._thread = self._life.start(self._run)

    def pending(self) -> int:
        """How many clean-ups are waiting to be delivered (for tests)."""
        return len(self._pending)

    def drop_pending(self) -> None:
        """Forget every clean-up not delivered yet, the one in hand too (for tests)."""
        with self._lock:
            self._pending.clear()
            self._dropped += 1

    def wait_idle(self, timeout: float) -> bool:
        """Wait for every clean-up to be delivered (or dropped); ``False`` if
        some are still pending after ``timeout`` seconds (for tests)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self._pending and (self._thread is None or not self._thread.is_alive())

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                item, dropped = self._pending.popleft(), self._dropped
            client, call, until, after = item
            if after is not None and not after.done():
                concurrent.futures.wait([after], timeout=CLEANUP_RETRY_DELAY)
                delivered = False
            else:
                delivered = self._deliver(client, call)
                if not delivered:
                    time.sleep(CLEANUP_RETRY_DELAY)
            if not delivered and time.monotonic() < until:
                with self._lock:
                    if self._dropped == dropped:  # else forgotten meanwhile
                        self._pending.append(item)

    @staticmethod
    def _deliver(client: Any, call: Call) -> bool:
        """One try, bounded like a background write (``within``): sent on the
        client itself where it has no sibling, one stuck on a hung server
        with no socket timeout kept every later clean-up, for every server,
        waiting as long."""
        try:
            within(client, CLEANUP_TIMEOUT, lambda on: call.script(on, call.keys, call.args))
        except backend.BACKEND_ERRORS as exc:  # Abandoned is a TimeoutError (OSError)
            logger.debug("Clean-up %r not delivered yet: %s", call.script, exc)
            return False
        return True


janitor = Janitor()
