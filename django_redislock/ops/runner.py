"""``manage.py lead``'s runner: a command run only while this process leads a name.

Every pod runs ``manage.py lead beat -- celery -A proj beat``; one leads and
runs the command, the others are standbys queued on the leadership's lock
(``primitives/leadership.py``). The runner is one loop on one queue of events,
so it reacts at once to whichever comes first:

- ``("exit", proc, status)``: the command ended: the runner resigns and exits
  with its status;
- ``("revoked", term)``: the lease was lost (Redis unreachable past the lease,
  the key cleared, this process paused past it): the command gets SIGTERM,
  SIGKILL after ``grace``, and the runner campaigns again;
- ``("signal", signum)``: SIGTERM or SIGINT to the runner: it stops the command
  the same way and resigns, so a standby takes over at once.

A signal that arrives while the runner is a standby interrupts its wait (the
lock's interrupted acquire leaves the queue cleanly). Signal handlers only
``put`` on a ``queue.SimpleQueue``, whose ``put`` is safe in a signal handler.

The command runs in a session of its own (so the runner signals its whole
process group) and, on Linux, with ``PR_SET_PDEATHSIG``: a runner killed with
SIGKILL takes its command with it, so a standby's command never runs beside an
orphan. A leader paused with its command (SIGSTOP, a frozen VM) can still write
for a moment when it resumes: the command gets the term's fencing token in
``REDISLOCK_FENCING_TOKEN`` for that (``docs/long-holds.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_redislock.exceptions import LockBackendError
from django_redislock.primitives.leadership import Leadership
from django_redislock.primitives.leadership_common import FIRST_RETRY, MAX_RETRY

logger = logging.getLogger(__name__)

#: Signals that make the runner stop its command and resign.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: Run before the command on Linux: die with the runner (``PR_SET_PDEATHSIG``),
#: then exec it. A fresh interpreter, so no other thread can hold a lock at the
#: fork (which ``preexec_fn`` cannot promise in a process with threads).
_SHIM = """\
import ctypes, os, signal, sys
try:
    refused = ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0  # PR_SET_PDEATHSIG
    refused = refused and os.strerror(ctypes.get_errno())
except Exception as exc:
    refused = repr(exc)
if refused:
    sys.stderr.write(
        f"lead: prctl(PR_SET_PDEATHSIG) failed ({refused}): the command will not die "
        "with a killed runner\\n"
    )
if os.getppid() != int(sys.argv[1]):
    os._exit(137)  # the runner died before prctl: never run without it
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"lead: cannot run {sys.argv[2]!r}: {exc}\\n")
    os._exit(127)
"""


class _Stop(BaseException):
    """Raised by the signal handler into a standby's wait: stop campaigning."""


def find_program(program: str) -> str | None:
    """The executable the command names, or ``None`` when there is none."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) and os.path.isfile(program) else None
    return shutil.which(program)


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Runner:
    """Runs ``command`` while this process leads ``name``; see the module docstring."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        timeout: float | None,
        grace: float,
        using: str | None,
        say: Callable[[str], None],
    ) -> None:
        self.command = list(command)
        self.grace = grace
        self.say = say
        self.events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.leadership = Leadership(name, timeout=timeout, using=using, on_revoked=self._revoked)
        self.campaigning = False
        self.stopping: int | None = None

    def _revoked(self, leadership: Leadership) -> None:
        self.events.put(("revoked", leadership.terms))

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = signum
        if self.campaigning:
            raise _Stop
        self.events.put(("signal", signum))

    def run(self) -> int:
        """Lead, run, stop, campaign again, until the command exits (its
        status) or a signal stops the runner (0)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            while True:
                try:
                    self._campaign()
                except _Stop:
                    return 0
                status = self._lead()
                if status is not None:
                    return status
                if self.stopping is not None:
                    return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.leadership.resign()

    def _campaign(self) -> None:
        """Wait to be elected; an unreachable Redis is waited out, backing off."""
        name = self.leadership.name
        retry = FIRST_RETRY
        self.campaigning = True
        try:
            if self.stopping is not None:
                raise _Stop
            self.say(f"Standing by for {name!r}.")
            while True:
                try:
                    if self.leadership.campaign():
                        return
                except LockBackendError as exc:
                    logger.warning("lead %r: cannot campaign (%s); retrying", name, exc)
                    time.sleep(retry)  # a backoff, interrupted by a stop signal (_Stop)
                    retry = min(MAX_RETRY, retry * 2)
        finally:
            self.campaigning = False

    def _lead(self) -> int | None:
        """Run the command for one term: its exit status when it ended on its
        own (the runner resigns), else ``None`` once it was stopped."""
        leadership = self.leadership
        term = leadership.terms
        proc = self._start(leadership)
        while True:
            event = self.events.get()
            if event[0] == "exit" and event[1] is proc:
                leadership.resign()
                status = exit_status(event[2])
                self.say(f"{self.command[0]} exited with status {status}; resigned.")
                return status
            if event[0] == "revoked" and event[1] == term:
                self.say(f"Lost the leadership of {leadership.name!r}: stopping the command.")
                self._stop(proc)
                return None
            if event[0] == "signal":
                self.say(f"{signal.Signals(event[1]).name}: stopping the command, then resigning.")
                self._stop(proc)
                leadership.resign()
                self.say(f"Resigned {leadership.name!r}.")
                return None

    def _start(self, leadership: Leadership) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "REDISLOCK_LEADER_NAME": leadership.name,
            "REDISLOCK_FENCING_TOKEN": str(leadership.fencing_token or ""),
        }
        argv = self.command
        if sys.platform.startswith("linux"):
            argv = [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *argv]
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        threading.Thread(
            target=lambda: self.events.put(("exit", proc, proc.wait())),
            name=f"lead-wait:{proc.pid}",
            daemon=True,
        ).start()
        self.say(
            f"Leading {leadership.name!r} (fencing token {leadership.fencing_token}): "
            f"started {self.command[0]} (pid {proc.pid})."
        )
        return proc

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the command's process group, SIGKILL after ``grace``;
        returns once it has exited (its exit event taken)."""
        self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        killed = False
        while True:
            left = deadline - time.monotonic()
            try:
                event = self.events.get(timeout=None if killed else max(0.0, left))
            except queue.Empty:
                self.say(f"{self.command[0]} still runs after {self.grace:g} s: SIGKILL.")
                self._signal(proc, signal.SIGKILL)
                killed = True
                continue
            if event[0] == "exit" and event[1] is proc:
                return
            # a stop signal meanwhile is kept in self.stopping; a revocation
            # of this term changes nothing: the command is being stopped

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(proc.pid, signum)
