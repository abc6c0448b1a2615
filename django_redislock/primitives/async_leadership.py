"""``AsyncLeadership``: ``Leadership`` for asyncio (``leadership_common.py`` has how).

A loss is learnt on the process's loss-callback thread; ``is_leader`` is
false from then, and ``on_revoked`` (and a new campaign, with
``campaign_again``) runs on the event loop that campaigned.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_redislock import signals
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import LOCK_RELEASE
from django_redislock.engine.drivers import AsyncConnection
from django_redislock.engine.steps import NOT_OURS
from django_redislock.exceptions import LockBackendError, LockTimeout
from django_redislock.holds.holding import Holding, current_pid
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.leadership_common import (
    CAMPAIGN_CHUNK,
    FIRST_RETRY,
    LEADER_PREFIX,
    MAX_RETRY,
    AsyncLeaderLock,
    Campaigner,
    already_leading,
)
from django_redislock.validation import check_seconds

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)


def _settle(ended: asyncio.Future[None]) -> None:
    if not ended.done():
        ended.set_result(None)


class AsyncLeadership(Campaigner[AsyncLock]):
    """``Leadership`` for asyncio: ``async with AsyncLeadership("beat") as
    leader:``, ``await leader.campaign()``, ``await leader.resign()``. The
    callbacks may be coroutine functions; ``on_revoked`` runs on the event
    loop that campaigned. ``campaign_again`` campaigns again in a task."""

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
        self._lock = AsyncLeaderLock(LEADER_PREFIX + self.name, **self._lock_args)  # type: ignore[arg-type]
        self._loop: Any = None
        self._tasks: set[Any] = set()
        self._waiting: set[asyncio.Future[None]] = set()

    async def campaign(self, blocking_timeout: float | None = None) -> bool:
        """As ``Leadership.campaign``, awaited. A ``campaign_again`` campaign
        running in the background is cancelled first: this one replaces it."""
        budget = self._budget(blocking_timeout)
        with self._state:
            if self.is_leader:
                return True
            self._closed = False
        await self._cancel_background()
        return await self._campaign(budget)

    async def _cancel_background(self) -> None:
        tasks = [task for task in self._tasks if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _campaign(self, budget: float | None) -> bool:
        self._loop = asyncio.get_running_loop()
        deadline = None if budget is None else time.monotonic() + budget
        while True:
            left = CAMPAIGN_CHUNK if deadline is None else max(0.0, deadline - time.monotonic())
            if await self._lock.acquire(blocking_timeout=left):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
        holding = self._lock._holding()
        assert holding is not None
        if holding.depth > 1:  # re-entered: this task leads through another object
            await self._lock.release()
            raise already_leading(self.name)
        if not self._won(holding):
            await self._release(holding)
            return False
        await self._acall(self._on_elected, "on_elected")
        return self.is_leader

    async def resign(self) -> None:
        """As ``Leadership.resign``, awaited."""
        with self._state:
            self._closed = True
            holding = self._holding
            resigned = holding is not None and self._step_down(holding, None)
        await self._cancel_background()
        if resigned and holding is not None:
            await self._release(holding)

    async def _release(self, holding: Holding) -> None:
        if holding.pid != current_pid():  # a forked child's copy: the hold is its parent's
            return
        holding.releasing = True
        try:
            with backend.translate_errors(self._lock.name):
                result = await AsyncConnection(holding.client).run_to_the_end(
                    LOCK_RELEASE, holding.keys, holding.release_args
                )
        except LockBackendError as exc:
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

    async def _acall(self, callback: Callable[..., Any] | None, event: str) -> None:
        result = self._call(callback, event)
        if inspect.isawaitable(result):
            try:
                await result
            except Exception:
                logger.exception("The %s callback of leadership %r failed", event, self.name)

    async def wait_revoked(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        """As ``Leadership.wait_revoked``, awaited: the loop is not blocked."""
        budget = check_seconds(timeout, "timeout", allow_zero=True)
        if not self._leading:
            return True
        ended = asyncio.get_running_loop().create_future()
        self._waiting.add(ended)
        try:
            if not self._leading:  # stepped down meanwhile, on another thread
                return True
            await asyncio.wait_for(asyncio.shield(ended), budget)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._waiting.discard(ended)

    def _step_down(self, holding: Holding, reason: str | None) -> bool:
        if not super()._step_down(holding, reason):
            return False
        for ended in list(self._waiting):  # wait_revoked()'s, each on its own loop
            with contextlib.suppress(RuntimeError):  # that loop is closed
                ended.get_loop().call_soon_threadsafe(_settle, ended)
        if reason is not None:
            holding.end()
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._after_loss)
        return True

    def _after_loss(self) -> None:
        """On the event loop: ``on_revoked``, then campaign again if asked."""

        async def run() -> None:
            await self._acall(self._on_revoked, "on_revoked")
            retry = FIRST_RETRY
            while self.campaign_again and not self._closed and not self._leading:
                try:
                    await self._campaign(None)  # not campaign(): it would cancel this task
                    return
                except LockBackendError as exc:
                    logger.warning("Leadership %r: campaign failed (%s); retrying", self.name, exc)
                await asyncio.sleep(retry)
                retry = min(MAX_RETRY, retry * 2)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __aenter__(self) -> Self:
        if not await self.campaign():
            raise LockTimeout(
                f"Not elected leader of {self.name!r} in time.", name=self.name, retry_after=None
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.resign()
