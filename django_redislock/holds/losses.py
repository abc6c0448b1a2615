"""What a holder asked to be told, or to have done, when its lease is lost.

A hold's ``lost`` flag (``Holding.lost``) is set the moment the loss is known
(a renewal that found the lease gone or could not reach Redis before it
ended, a release or extend that found it gone, ``max_hold`` reached). The
holder may ask for more (``LossHooks``, only on holds that ask):

- ``on_lost``: a callable, called once with the hold's handle. It runs on
  the process's one loss-callback thread (``_callbacks``), never on the
  watchdog's: a callback that blocks, raises or takes a while (logging to a
  remote service, signalling a worker to stop) must not delay the renewals
  of every other lease of the process, and losses come in bursts (a Redis
  restart loses every lease at once), so a thread per loss could start
  thousands. One thread, one callback at a time: a user's callback never
  runs concurrently with itself, and the thread exits when idle. An
  exception from it is logged, and the next callback runs.
- ``cancel_on_loss`` (asyncio): the holding task is cancelled on its own
  loop (``call_soon_threadsafe``); the ``async with`` block then raises
  ``LockLostError`` instead of the ``CancelledError`` (``AsyncPrimitive``).
- ``max_hold``: the watchdog stops renewing after that long since the
  acquire, and reports the loss as any other (``CAPPED`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_redislock.engine.workers import DaemonPool
from django_redislock.validation import check_bool, check_seconds

if TYPE_CHECKING:
    from django_redislock.holds.holding import Holding

logger = logging.getLogger(__name__)

#: The reason a hold capped by ``max_hold`` was let go (``lock_lost``'s
#: ``reason`` starts with ``CAPPED_PREFIX``).
CAPPED_PREFIX = "held longer than max_hold="
CAPPED = CAPPED_PREFIX + "{:g}s; the watchdog stopped renewing it"

#: Seconds the loss-callback thread lingers with nothing to do.
IDLE_EXIT = 5.0

#: The one thread that runs ``on_lost`` callbacks, in turn (see the module).
_callbacks = DaemonPool(1, "django-redislock-on-lost", idle_exit=IDLE_EXIT)

#: While an ``on_lost`` callback runs: its handle and hold, so that ``handle.lost``
#: and ``handle.check()`` answer for the lost hold on the callback's thread.
reporting: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "django_redislock_reporting", default=None
)


def capped_reason(max_hold: float) -> str:
    return CAPPED.format(max_hold)


class LossOptions:
    """A handle's ``on_lost``, ``max_hold`` and ``cancel_on_loss``, checked
    once when it is built (``loss_options``); ``None`` stands for none."""

    __slots__ = ("cancel_on_loss", "max_hold", "on_lost")

    def __init__(
        self, on_lost: Callable[[Any], object] | None, max_hold: float | None, cancel: bool
    ) -> None:
        self.on_lost = on_lost
        self.max_hold = max_hold
        self.cancel_on_loss = cancel


def loss_options(
    on_lost: object, max_hold: object, cancel_on_loss: object, *, asyncio_holds: bool
) -> LossOptions | None:
    """Check a primitive's loss options; ``None`` when it uses none (the common case)."""
    if on_lost is None and max_hold is None and cancel_on_loss is False:
        return None
    if on_lost is not None and not callable(on_lost):
        raise TypeError(f"on_lost must be a callable or None, not {on_lost!r}.")
    cap = check_seconds(max_hold, "max_hold")
    cancel = bool(check_bool(cancel_on_loss, "cancel_on_loss", allow_none=False))
    if cancel and not asyncio_holds:
        raise TypeError(
            "cancel_on_loss is for asyncio holds (AsyncLock, AsyncSemaphore, "
            "AsyncReadWriteLock); a thread cannot be cancelled: use on_lost or check()."
        )
    return LossOptions(on_lost, cap, cancel)


class LossHooks:
    """What one hold asked for (``Holding.hooks``): built at its acquire."""

    __slots__ = ("cancelled", "handle", "leaving", "loop", "max_hold", "on_lost", "task", "until")

    def __init__(
        self, handle: object, options: LossOptions | None, max_hold: float | None, started: float
    ) -> None:
        self.handle = weakref.ref(handle)
        self.on_lost = options.on_lost if options is not None else None
        self.max_hold = max_hold
        #: When the watchdog stops renewing (``time.monotonic()``; inf: never).
        self.until = math.inf if max_hold is None else started + max_hold
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        if options is not None and options.cancel_on_loss:
            self.task = asyncio.current_task()
            self.loop = self.task.get_loop() if self.task is not None else None
        #: Whether the loss cancelled the task (``cancel_on_loss``).
        self.cancelled = False
        #: Set when the holder leaves its block: a cancel not sent by then never is.
        self.leaving = False

    def fire(self, holding: Holding, reason: str) -> None:
        """``holding`` was just found lost (``Holding.mark_lost``, once)."""
        if self.task is not None:
            self._cancel(reason)
        if self.on_lost is not None and self.handle() is not None:
            try:
                _callbacks.submit(_call, self.on_lost, self.handle, holding)
            except RuntimeError:  # no thread could start: run it here rather than never
                _call(self.on_lost, self.handle, holding)

    def _cancel(self, reason: str) -> None:
        """Cancel the holding task on its loop, unless the task found the loss
        itself (its own release or extend raises ``LockLostError`` to it)."""
        loop = self.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to cancel
            loop.call_soon_threadsafe(self._cancel_now, reason)

    def _cancel_now(self, reason: str) -> None:
        """(On the task's loop.)"""
        task = self.task
        if task is None or task.done() or self.leaving:
            return
        self.cancelled = True
        task.cancel(f"django-redislock: the lease was lost: {reason}")


def _call(on_lost: Callable[[Any], object], handle_ref: weakref.ref[Any], holding: Holding) -> None:
    """Run one ``on_lost`` callback; its exception is logged, never raised."""
    handle = handle_ref()
    if handle is None:
        return
    token = reporting.set((handle, holding))
    try:
        on_lost(handle)
    except Exception:
        logger.exception("The on_lost callback of %r raised", holding.name)
    finally:
        reporting.reset(token)
        del handle


def thread_count() -> int:
    """Loss-callback threads alive (0 or 1); for tests."""
    return _callbacks.workers()
