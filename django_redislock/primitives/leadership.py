"""``Leadership``: leader election on a name, for threads (``leadership_common.py`` has how).

A term is a hold of the ``Lock`` ``leader:<name>``; ``resign()`` sends that
lock's release script itself, so any thread may resign a term another thread
campaigned for (the lock's holder is the thread that took it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.engine import pool
from django_redislock.engine.steps import NOT_OURS
from django_redislock.exceptions import LockBackendError, LockTimeout
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.primitives.leadership_common import (
    CAMPAIGN_CHUNK,
    FIRST_RETRY,
    LEADER_PREFIX,
    MAX_RETRY,
    Campaigner,
    LeaderLock,
    already_leading,
)
from django_redislock.primitives.lock import Lock

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["Leadership"]


class Leadership(Campaigner[Lock]):
    """Leader election on ``name``: at most one leader at a time among every
    process that campaigns on the same Redis.

    ``with Leadership("beat") as leader:`` campaigns until elected (for ever,
    unless ``blocking_timeout`` bounds it: then ``LockTimeout``), and resigns
    when the block ends. ``timeout``: the lease (default
    ``REDISLOCK["TIMEOUT"]``), which bounds how long a dead or paused leader
    keeps the name. ``on_elected(leader)`` / ``on_revoked(leader)`` are
    called on each election and on each end of a term by a lost lease (not
    on ``resign()``), in the thread that learnt it; their exceptions are
    logged. A leader whose lease is lost steps down and never raises for it;
    with ``campaign_again=True`` it campaigns again in a background thread
    until re-elected or resigned.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking_timeout: float | None = None,
        using: str | None = None,
        on_elected: Callable[..., Any] | None = None,
        on_revoked: Callable[..., Any] | None = None,
        campaign_again: bool = False,
    ) -> None:
        super().__init__(
            name, timeout=timeout, blocking_timeout=blocking_timeout, using=using,
            on_elected=on_elected, on_revoked=on_revoked, campaign_again=campaign_again,
        )  # fmt: skip
        self._lock = LeaderLock(LEADER_PREFIX + self.name, **self._lock_args)  # type: ignore[arg-type]
        self._wake = threading.Event()
        self._background: threading.Thread | None = None

    def campaign(self, blocking_timeout: float | None = None) -> bool:
        """Wait to be elected: ``True`` once leading (at once when already),
        ``False`` when ``blocking_timeout`` (default: the constructor's, else
        for ever) ran out. ``LockBackendError`` when Redis cannot be reached.
        While ``campaign_again`` campaigns in the background, this waits for
        that campaign instead of queueing beside it."""
        budget = self._budget(blocking_timeout)
        with self._state:
            if self.is_leader:
                return True
            self._closed = False
            background = self._background
        if background is not None and background.is_alive():
            return self._elected.wait(budget) and self.is_leader
        return self._campaign(budget)

    def _campaign(self, budget: float | None) -> bool:
        """``campaign``'s wait: the leader lock's acquire, ``budget`` seconds
        (``None``: for ever, a ``CAMPAIGN_CHUNK`` at a time)."""
        deadline = None if budget is None else time.monotonic() + budget
        while True:
            left = CAMPAIGN_CHUNK if deadline is None else max(0.0, deadline - time.monotonic())
            if self._lock.acquire(blocking_timeout=left):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
        holding = self._lock._holding()
        assert holding is not None
        if holding.depth > 1:  # re-entered: this thread leads through another object
            self._lock.release()
            raise already_leading(self.name)
        if not self._won(holding):
            self._release(holding)
            return False
        self._call(self._on_elected, "on_elected")
        return self.is_leader

    def resign(self) -> None:
        """Stop leading now, from any thread: ``is_leader`` is false at once,
        and the lock is released (one round trip), so the first standby takes
        over without waiting for the lease. Stops a ``campaign_again`` loop.
        Redis unreachable is logged, not raised: the lease frees the name."""
        with self._state:
            self._closed = True
            holding = self._holding
            resigned = holding is not None and self._step_down(holding, None)
        self._wake.set()
        if resigned and holding is not None:
            self._release(holding)
            return
        stray = self._lock._holding()  # a campaign interrupted between its acquire and _won
        if stray is not None and stray.active and stray is not holding:
            self._release(stray)

    def _release(self, holding: Holding) -> None:
        """Release ``holding``'s lock whichever thread took it: the release
        script sent directly (the hold is the leadership's, not its thread's)."""
        if holding.pid != current_pid():  # a forked child's copy: the hold is its parent's
            return
        holding.releasing = True
        try:
            result = pool.send(LOCK_RELEASE, holding.client, holding.keys, holding.release_args)
        except backend.BACKEND_ERRORS as exc:
            logger.warning(
                "Leadership %r: could not release on resigning (%s); its lease frees it",
                self.name, exc,
            )  # fmt: skip
            result = None
        if result == NOT_OURS and holding.lost is None:
            holding.mark_lost("the lease was gone when the leader resigned")
        holding.end()
        if result == 0:  # released (or handed to the first standby)
            signals.announce_released(self._lock, holding.acquired_at)

    def _step_down(self, holding: Holding, reason: str | None) -> bool:
        if not super()._step_down(holding, reason):
            return False
        if reason is None:
            return True
        holding.end()
        self._call(self._on_revoked, "on_revoked")
        if self.campaign_again and not self._closed:
            self._wake.clear()
            thread = threading.Thread(
                target=self._recampaign, name=f"redislock-campaign:{self.name}", daemon=True
            )
            with self._state:
                self._background = thread
            thread.start()
        return True

    def _recampaign(self) -> None:
        """``campaign_again``'s loop: campaign until elected or resigned; an
        unreachable Redis is waited out (backing off, woken by ``resign``)."""
        retry = FIRST_RETRY
        while not self._closed and not self._leading:
            try:
                self._campaign(None)  # not campaign(): a resign meanwhile stays a resign
                return
            except LockBackendError as exc:
                logger.warning("Leadership %r: campaign failed (%s); retrying", self.name, exc)
            except Exception:
                logger.exception("Leadership %r: campaign failed; retrying", self.name)
            self._wake.wait(retry)
            retry = min(MAX_RETRY, retry * 2)

    def __enter__(self) -> Self:
        if not self.campaign():
            raise LockTimeout(
                f"Not elected leader of {self.name!r} in time.", name=self.name, retry_after=None
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.resign()
