"""A hold whose lease ran out is told so even when its release cannot reach Redis.

A holder without renewal (``auto_renew=False``) keeps its section past its
lease; Redis rightly lets the next holder in. Its release (or ``extend()``, or
leaving ``with``) then meets a slow network: 0.4 s per chunk each way through
the suite's fault proxy, over a 0.5 s ``SOCKET_TIMEOUT``. The holder's own
clock says its lease ended before the release was sent, so it is told:
``LockLostError`` chained to the ``LockBackendError``, ``lock_lost`` once.
(Before, it got a ``LockBackendError`` alone and no ``lock_lost``: issue 31.)
A release sent while the lease still runs proves nothing lost and stays a
``LockBackendError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import (
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    Lock,
    LockBackendError,
    LockLostError,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
)
from django_redislock import signals as lock_signals
from tests.settings import redis_cache
from tests.support.faultproxy import FaultProxy
from tests.support.other_holders import OtherThread
from tests.support.scaleout import REDLOCK_ALIASES, RedlockServers
from tests.support.signals_helper import capture

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("real_redis")]

LEASE = 1.0
SOCKET_TIMEOUT = 0.5
#: Per chunk, each way: a round trip (0.8 s) outlasts the socket timeout.
SLOW = 0.4
#: How long the other holder may wait for the first one's lease to run out.
PATIENCE = LEASE + 15
NAME = "stale"

#: Each primitive: the holder's handle (on ``using``), and another holder's,
#: which can be had only once the first one's lease ended.
Make = Callable[..., Any]
SYNC: dict[str, tuple[Make, Make]] = {
    "Lock": (lambda **kw: Lock(NAME, **kw), lambda **kw: Lock(NAME, **kw)),
    "Semaphore": (lambda **kw: Semaphore(NAME, 1, **kw), lambda **kw: Semaphore(NAME, 1, **kw)),
    "ReadLock": (
        lambda **kw: ReadWriteLock(NAME, **kw).read(),
        lambda **kw: ReadWriteLock(NAME, **kw).write(),
    ),
    "WriteLock": (
        lambda **kw: ReadWriteLock(NAME, **kw).write(),
        lambda **kw: ReadWriteLock(NAME, **kw).write(),
    ),
    "MultiLock": (
        lambda **kw: MultiLock([NAME, "other"], **kw),
        lambda **kw: MultiLock([NAME, "other"], **kw),
    ),
}
ASYNC: dict[str, tuple[Make, Make]] = {
    "AsyncLock": (lambda **kw: AsyncLock(NAME, **kw), SYNC["Lock"][1]),
    "AsyncSemaphore": (lambda **kw: AsyncSemaphore(NAME, 1, **kw), SYNC["Semaphore"][1]),
    "AsyncReadLock": (
        lambda **kw: AsyncReadWriteLock(NAME, **kw).read(),
        SYNC["ReadLock"][1],
    ),
    "AsyncWriteLock": (
        lambda **kw: AsyncReadWriteLock(NAME, **kw).write(),
        SYNC["WriteLock"][1],
    ),
}


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """The holder's path to Redis (``default``); ``direct`` goes around it."""
    with FaultProxy(redis_url) as running:
        caches = {
            "default": redis_cache(
                running.url, SOCKET_TIMEOUT=SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT
            ),
            "direct": redis_cache(redis_url),
        }
        with override_settings(CACHES=caches):
            yield running


def assert_told(error: LockLostError, lost: list[dict[str, Any]], kind: str = "Lock") -> None:
    """``LockLostError`` chained to the backend error, and ``lock_lost`` once
    for the name (for each of a ``MultiLock``'s parts)."""
    names = sorted({NAME, "other"} if kind == "MultiLock" else {NAME})
    assert error.name in names
    cause = error.__cause__
    assert isinstance(cause, LockBackendError), repr(cause)
    assert isinstance(cause.__cause__, redis.TimeoutError | redis.ConnectionError)
    assert sorted(call["name"] for call in lost) == names, lost


def take_after_the_lease(other: OtherThread, make_other: Make, holding: Any) -> Any:
    """Another holder takes the name (waiting, on a direct connection, for
    the first one's lease to run out in Redis); by then the first holder's
    own clock has passed its lease end too (it ends no later than Redis's)."""
    taker = make_other(using="direct", timeout=30, auto_renew=False)
    assert other(taker.acquire, blocking_timeout=PATIENCE), "the first lease never ran out"
    assert time.monotonic() >= holding.lease_deadline
    return taker


def still_held_by(other: OtherThread, taker: Any) -> None:
    """The stale holder's release, once Redis got it, freed nothing."""
    assert other(taker.owned)
    other(taker.release)


def holding_of(handle: Any) -> Any:
    if isinstance(handle, MultiLock):
        return handle.locks[0]._holding()
    return handle._holding() if hasattr(handle, "_holding") else handle._latest()


@pytest.mark.parametrize("action", ["release", "extend", "with"])
@pytest.mark.parametrize("kind", list(SYNC))
def test_a_stale_holders_failed_release_tells_it_the_lease_was_lost(
    proxy: FaultProxy, other_thread: OtherThread, kind: str, action: str
) -> None:
    make, make_other = SYNC[kind]
    held = make(timeout=LEASE, auto_renew=False)
    with capture(lock_signals.lock_lost) as lost:
        with pytest.raises(LockLostError) as info:
            if action == "with":
                with held:
                    taker = take_after_the_lease(other_thread, make_other, holding_of(held))
                    proxy.latency = SLOW
            else:
                assert held.acquire(blocking=False)
                taker = take_after_the_lease(other_thread, make_other, holding_of(held))
                proxy.latency = SLOW
                getattr(held, action)()
        proxy.heal()
        if action == "extend":  # still this holder's to release: it says lost, once
            with pytest.raises(LockLostError):
                held.release()
    assert_told(info.value, lost, kind)
    still_held_by(other_thread, taker)


@pytest.mark.parametrize("action", ["release", "extend", "with"])
@pytest.mark.parametrize("kind", list(ASYNC))
def test_an_async_stale_holders_failed_release_tells_it_the_lease_was_lost(
    proxy: FaultProxy, other_thread: OtherThread, kind: str, action: str
) -> None:
    make, make_other = ASYNC[kind]

    async def main() -> tuple[LockLostError, list[dict[str, Any]], Any]:
        held = make(timeout=LEASE, auto_renew=False)
        taken: list[Any] = []

        async def take() -> None:
            taken.append(
                await asyncio.to_thread(
                    take_after_the_lease, other_thread, make_other, holding_of(held)
                )
            )
            proxy.latency = SLOW

        with capture(lock_signals.lock_lost) as lost:
            with pytest.raises(LockLostError) as info:
                if action == "with":
                    async with held:
                        await take()
                else:
                    assert await held.acquire(blocking=False)
                    await take()
                    await getattr(held, action)()
            proxy.heal()
            if action == "extend":
                with pytest.raises(LockLostError):
                    await held.release()
        return info.value, list(lost), taken[0]

    error, lost, taker = asyncio.run(main())
    assert_told(error, lost)
    still_held_by(other_thread, taker)


@pytest.mark.parametrize("kind", ["Lock", "Semaphore", "MultiLock"])
def test_a_failed_release_within_the_lease_is_a_backend_error_not_a_loss(
    proxy: FaultProxy, kind: str
) -> None:
    """Sent while the lease still ran, an unanswered release proves no loss:
    the section ended in time, and the lease frees the name."""
    held = SYNC[kind][0](timeout=30, auto_renew=False)
    with capture(lock_signals.lock_lost) as lost:
        assert held.acquire(blocking=False)
        proxy.latency = SLOW
        with pytest.raises(LockBackendError):
            held.release()
        proxy.heal()
    assert lost == []


def test_a_release_failing_after_the_watchdog_reported_the_loss_says_lost(
    proxy: FaultProxy,
) -> None:
    """The watchdog's renewals time out on the slow path and it reports the
    loss; the release that fails on the same path says lost too, not only
    that Redis is slow, and ``lock_lost`` is not sent again."""
    held = Lock(NAME, timeout=LEASE, auto_renew=True)
    with capture(lock_signals.lock_lost) as lost:
        assert held.acquire(blocking=False)
        proxy.latency = SLOW
        deadline = time.monotonic() + PATIENCE
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost, "the watchdog never reported the loss"
        with pytest.raises(LockLostError) as info:
            held.release()
        proxy.heal()
    assert_told(info.value, lost)


@pytest.fixture
def redlock_proxies(redlock_servers: RedlockServers) -> Iterator[list[FaultProxy]]:
    """``REDLOCK`` aliases through a proxy each; ``direct0``.. around them."""
    from django.conf import settings

    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy(s.url)) for s in redlock_servers.servers]
        caches = dict(settings.CACHES)
        for alias, proxy, server in zip(
            REDLOCK_ALIASES, proxies, redlock_servers.servers, strict=True
        ):
            caches[alias] = redis_cache(
                proxy.url, SOCKET_TIMEOUT=SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT=SOCKET_TIMEOUT
            )
            caches[f"direct-{alias}"] = redis_cache(server.url)
        with override_settings(CACHES=caches):
            yield proxies


@pytest.mark.parametrize("action", ["release", "extend", "with"])
def test_a_stale_redlocks_failed_release_tells_it_the_lease_was_lost(
    redlock_proxies: list[FaultProxy], other_thread: OtherThread, action: str
) -> None:
    direct = [f"direct-{alias}" for alias in REDLOCK_ALIASES]
    held = Redlock(NAME, timeout=LEASE, auto_renew=False)
    taker = Redlock(NAME, timeout=30, auto_renew=False, using=direct)

    def take_and_slow_down() -> None:
        holding = held._holding()
        assert other_thread(taker.acquire, blocking_timeout=PATIENCE)
        assert time.monotonic() >= holding.lease_deadline
        for proxy in redlock_proxies:
            proxy.latency = SLOW

    with capture(lock_signals.lock_lost) as lost:
        with pytest.raises(LockLostError) as info:
            if action == "with":
                with held:
                    take_and_slow_down()
            else:
                assert held.acquire(blocking=False)
                take_and_slow_down()
                getattr(held, action)()
        for proxy in redlock_proxies:
            proxy.heal()
        error = info.value
        assert isinstance(error.__cause__, LockBackendError), repr(error.__cause__)
        assert [call["name"] for call in lost] == [NAME]
        if action == "extend":
            with pytest.raises(LockLostError):
                held.release()
            assert len(lost) == 1
    assert other_thread(taker.owned)
    other_thread(taker.release)


@pytest.mark.django_db(transaction=True)
def test_require_lock_in_a_transaction_rolls_back_when_its_lease_ran_out_unreachably(
    proxy: FaultProxy, other_thread: OtherThread
) -> None:
    """``@require_lock``'s writes have no guard of their own: once its lease
    ran out, the hand-over to the transaction (a confirming ``extend()``)
    that cannot reach Redis must raise ``LockLostError`` into it, so it rolls
    back, rather than log the backend error and commit."""
    from django.db import transaction

    from django_redislock import require_lock
    from tests.models import Item

    item = Item.objects.create(stock=5, title="before")
    taken: list[Any] = []

    @require_lock("retitle:<pk>", timeout=LEASE)
    def retitle(pk: int) -> None:
        Item.objects.filter(pk=pk).update(title="written past the lease")
        holding = Lock(f"retitle:{pk}")._holding()
        taken.append(
            take_after_the_lease(other_thread, lambda **kw: Lock(f"retitle:{pk}", **kw), holding)
        )
        proxy.latency = SLOW

    with (
        override_settings(REDISLOCK={"AUTO_RENEW": False}),
        capture(lock_signals.lock_lost) as lost,
    ):
        with pytest.raises(LockLostError) as info, transaction.atomic():
            retitle(item.pk)
        proxy.heal()
    assert isinstance(info.value.__cause__, LockBackendError)
    assert [call["name"] for call in lost] == [f"retitle:{item.pk}"]
    item.refresh_from_db()
    assert item.title == "before"
    still_held_by(other_thread, taken[0])


@pytest.mark.django_db(transaction=True)
def test_require_lock_in_a_transaction_rolls_back_when_its_lease_ends_before_the_commit(
    proxy: FaultProxy, other_thread: OtherThread
) -> None:
    """Without renewal nothing reports a lease that runs out after the
    hand-over and before the commit; the holder's own clock says it ended,
    so the commit rolls back and raises, as for a reported loss (before, it
    committed, and the release after it logged a warning)."""
    from django.db import transaction

    from django_redislock import require_lock
    from tests.models import Item

    item = Item.objects.create(stock=5, title="before")
    name = f"retitle:{item.pk}"

    @require_lock("retitle:<pk>", timeout=LEASE)
    def retitle(pk: int) -> None:
        Item.objects.filter(pk=pk).update(title="committed past the lease")

    with (
        override_settings(REDISLOCK={"AUTO_RENEW": False}),
        capture(lock_signals.lock_lost) as lost,
    ):
        with pytest.raises(LockLostError), transaction.atomic():
            retitle(item.pk)  # confirmed (its lease renewed) and handed over
            holding = Lock(name)._holding()
            taker = take_after_the_lease(other_thread, lambda **kw: Lock(name, **kw), holding)
    assert [call["name"] for call in lost] == [name]
    item.refresh_from_db()
    assert item.title == "before"
    still_held_by(other_thread, taker)
