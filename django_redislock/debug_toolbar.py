"""A Locks panel for django-debug-toolbar.

Optional: nothing else in the package imports this module, and the toolbar
stays an optional dependency. Add ``"django_redislock.debug_toolbar.LocksPanel"``
to ``DEBUG_TOOLBAR_PANELS`` to list, for each request the toolbar shows,
every lock, semaphore and read-write lock the request took or tried: name,
kind, time waited, time held, outcome (for one that timed out or was
refused, who held the name and for how long), whether the primitive
re-enters and its fencing token when one was taken.

It costs nothing when the toolbar is not shown: the panel connects its
receivers to ``django_redislock.signals`` only while it records a request
(``enable_instrumentation`` to ``disable_instrumentation``), so
``signals.wanted`` stays false otherwise and the primitives build no signal
arguments. A ``ContextVar`` tells which request a signal belongs to: it
follows the request's async tasks and the threads that run in its context
(``asgiref``'s ``sync_to_async``, ``contextvars.copy_context().run``).
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from debug_toolbar.panels import Panel
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_redislock import signals
from django_redislock.backend.values import holder_phrase

#: Outcomes, as the panel shows them.
HELD = "held"
TIMED_OUT = "timed out"
REFUSED = "refused"
LOST = "lost"
BACKEND_ERROR = "backend error"

#: Kinds whose holder re-enters a name it holds (per thread or task): a nested
#: acquire of one neither waits nor takes the name again, and is not listed.
REENTRANT_KINDS = frozenset({"lock", "leadership", "redlock"})


@dataclass
class Entry:
    """One acquire the request made or tried."""

    name: str
    kind: str
    started: float  # time.monotonic() when the attempt began
    waited: float
    outcome: str
    fencing_token: int | None = None
    held: float | None = None  # None: still held when the response was sent
    detail: str = ""

    @property
    def reentrant(self) -> bool:
        return self.kind in REENTRANT_KINDS


class Recording:
    """The entries of one request; appended to from its threads and tasks."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def open_entry(self, name: str, kind: str) -> Entry | None:
        """The latest hold of ``name`` still held (holds end last in, first out)."""
        for entry in reversed(self.entries):
            if (entry.name, entry.kind, entry.outcome, entry.held) == (name, kind, HELD, None):
                return entry
        return None

    def add(self, name: str, kind: str, waited: float, outcome: str, **extra: Any) -> Entry:
        started = time.monotonic() - waited
        entry = Entry(name, kind, started, waited, outcome, **extra)
        self.entries.append(entry)
        return entry


def _kind(sender: Any, kind: str) -> str:
    """``kind``, with the side for a read-write lock (``"rwlock read"``)."""
    if kind == "rwlock":
        sender_name = getattr(sender, "__name__", "")
        for side in ("Read", "Write"):
            if side in sender_name:
                return f"{kind} {side.lower()}"
    return kind


_recording: ContextVar[Recording | None] = ContextVar(
    "django_redislock_debug_toolbar", default=None
)


class LocksPanel(Panel):
    """Locks, semaphores and read-write locks taken or tried by the request."""

    is_async = True
    template = "django_redislock/debug_toolbar/locks.html"
    title = _("Locks")
    nav_title = _("Locks")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recording = Recording()
        self._token: Token[Recording | None] | None = None

    @property
    def nav_subtitle(self) -> str:
        stats = self.get_stats()  # type: ignore[no-untyped-call]
        count = len(stats.get("entries", ()))
        return ngettext(
            "%(count)d lock, %(waited).2fms waiting",
            "%(count)d locks, %(waited).2fms waiting",
            count,
        ) % {"count": count, "waited": stats.get("total_waited_ms", 0.0)}

    def _receivers(self) -> tuple[tuple[Any, Any], ...]:
        return (
            (signals.lock_acquired, self._acquired),
            (signals.lock_released, self._released),
            (signals.lock_lost, self._lost),
            (signals.lock_contended, self._contended),
            (signals.lock_failed, self._failed),
        )

    def enable_instrumentation(self) -> None:
        self._token = _recording.set(self.recording)
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid())

    def disable_instrumentation(self) -> None:
        for signal, _receiver in self._receivers():
            signal.disconnect(dispatch_uid=self._uid())
        if self._token is not None:
            _recording.reset(self._token)
            self._token = None

    def _uid(self) -> tuple[str, int]:
        return ("django_redislock.debug_toolbar", id(self))

    def _mine(self) -> Recording | None:
        recording = _recording.get()
        return recording if recording is self.recording else None

    def _acquired(self, sender: Any, *, name: str, kind: str, waited: float, **kwargs: Any) -> None:
        if (recording := self._mine()) is not None:
            token = kwargs.get("fencing_token")
            recording.add(name, _kind(sender, kind), waited, HELD, fencing_token=token or None)

    def _released(self, sender: Any, *, name: str, kind: str, held: float, **_: Any) -> None:
        if (recording := self._mine()) is not None and (
            entry := recording.open_entry(name, _kind(sender, kind))
        ) is not None:
            entry.held = held

    def _lost(
        self, sender: Any, *, name: str, kind: str, held: float, reason: str = "", **_: Any
    ) -> None:
        # sent from the watchdog's threads too, outside the request's context:
        # then the hold of that name this request has open is the one lost
        entry = self.recording.open_entry(name, _kind(sender, kind))
        if entry is not None:
            entry.outcome, entry.held, entry.detail = LOST, held, reason

    def _contended(
        self, sender: Any, *, name: str, kind: str, waited: float, **kwargs: Any
    ) -> None:
        if (recording := self._mine()) is not None:
            outcome = REFUSED if kwargs.get("outcome") == "refused" else TIMED_OUT
            holder, detail = kwargs.get("holder"), ""
            if holder is not None:
                detail = f"held by {holder_phrase(holder, kwargs.get('held_for'))}"
            recording.add(name, _kind(sender, kind), waited, outcome, detail=detail)

    def _failed(
        self, sender: Any, *, name: str, kind: str, waited: float, error: Any, **_: Any
    ) -> None:
        if (recording := self._mine()) is not None:
            recording.add(name, _kind(sender, kind), waited, BACKEND_ERROR, detail=str(error))

    def generate_stats(self, request: Any, response: Any) -> None:
        entries = sorted(self.recording.entries, key=lambda entry: entry.started)
        total = sum(entry.waited for entry in entries)
        self.record_stats(  # type: ignore[no-untyped-call]
            {
                "entries": [
                    {
                        "name": entry.name,
                        "kind": entry.kind,
                        "waited_ms": entry.waited * 1000,
                        "held_ms": None if entry.held is None else entry.held * 1000,
                        "outcome": entry.outcome,
                        "reentrant": entry.reentrant,
                        "fencing_token": entry.fencing_token,
                        "detail": entry.detail,
                    }
                    for entry in entries
                ],
                "total_waited_ms": total * 1000,
            }
        )
