"""What every single-name primitive's handle says of a loss while it holds:
``lost``, ``check()``, and the options ``on_lost``, ``max_hold`` and
``cancel_on_loss``, given to each new hold as its ``LossHooks``
(``holds/losses.py``, which runs them).

Plain functions of the handle: ``Primitive`` (``primitives/base.py``) and
``Redlock``, the two kinds of handle that have the loss API, name it in their
own bodies and call these, so it costs neither a base class nor, for a handle
built without loss options, anything at all (``_loss`` stays ``None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from django_redislock.holds import losses
from django_redislock.holds.holding import Holding
from django_redislock.holds.losses import LossHooks

if TYPE_CHECKING:
    from django_redislock.exceptions import LockLostError
    from django_redislock.holds.losses import LossOptions


class _Capped(Protocol):
    """What caps a hold whose handle sets no ``max_hold``: a ``Resolved``'s
    or the settings' ``MAX_HOLD`` (a ``Redlock`` has no ``Resolved``)."""

    @property
    def max_hold(self) -> float | None: ...


class Told(Protocol):
    """A handle with the loss API: its loss options (``None`` when built with
    none), and its view of the current holder's hold."""

    _loss: LossOptions | None

    def _hold_now(self) -> Holding | None: ...
    def _lost(self, holding: Holding) -> LockLostError: ...


def attach_hooks(handle: Told, holding: Holding, resolved: _Capped) -> None:
    """Give a new hold what its handle asked for on loss (``holds/losses.py``);
    called, before the watchdog sees the hold, only when the handle has loss
    options or ``MAX_HOLD`` is set."""
    options = handle._loss
    cap = options.max_hold if options is not None and options.max_hold else resolved.max_hold
    holding.hooks = LossHooks(handle, options, cap, holding.acquired_at)


def _reported(handle: Told) -> Holding | None:
    """The hold whose ``on_lost`` callback is running, when it is ``handle``'s."""
    reporting = losses.reporting.get()
    if reporting is not None and reporting[0] is handle:
        holding: Holding = reporting[1]
        return holding
    return None


def lost(handle: Told) -> bool:
    """``handle.lost``: whether the current holder's hold through it is known lost.

    No round trip: true from the moment the loss is known (the watchdog's
    renewal found the lease gone or could not renew it in time, a release
    or extend found it gone, ``max_hold`` was reached), until the holder
    leaves the hold. The holder is the thread (the asyncio task) that
    acquired, as for ``owned()``; inside the ``on_lost`` callback (on the
    library's thread) it is the hold being reported. ``False`` when the
    current holder holds nothing through this handle.
    """
    if _reported(handle) is not None:
        return True
    try:
        holding = handle._hold_now()
    except RuntimeError:  # an asyncio handle outside a task holds nothing there
        return False
    return holding is not None and holding.lost is not None


def check(handle: Told) -> None:
    """``handle.check()``: raise ``LockLostError`` if ``lost`` (no round trip)."""
    holding = _reported(handle)
    if holding is None:
        try:
            holding = handle._hold_now()
        except RuntimeError:
            return
    if holding is not None and holding.lost is not None:
        raise handle._lost(holding)
