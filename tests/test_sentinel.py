"""Locks through django-redis's SentinelClient, across a real failover."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_redislock import AsyncLock, Lock, LockBackendError, LockLostError
from django_redislock import signals as lock_signals
from django_redislock.backend import client as lock_backend
from tests.support.other_holders import OtherThread
from tests.support.scaleout import SentinelGroup, wait_until
from tests.support.signals_helper import capture

pytestmark = pytest.mark.scaleout


def test_locks_survive_or_report_a_failover(
    sentinel_group: SentinelGroup, other_thread: OtherThread
) -> None:
    """Kill the primary: replicated locks stay exclusive, a lost one is reported.

    ``survivor`` is replicated before the crash (``WAIT``); ``casualty`` is
    removed from the replica to stand for a write the replica never received
    (replication is asynchronous). After the replica is promoted, the
    survivor's holder keeps its lock and nobody else can take it, and the
    casualty's holder is told (``lock_lost``, ``LockLostError``) instead of
    believing it still holds a lock that another holder can now take.
    """
    caches = {"default": sentinel_group.cache(SOCKET_TIMEOUT=1.0, SOCKET_CONNECT_TIMEOUT=0.5)}
    with override_settings(CACHES=caches), capture(lock_signals.lock_lost) as lost:
        client = lock_backend.get_client("default")
        assert client.connection_pool.service_name == "mymaster"
        async_token, async_busy = asyncio.run(_async_round())  # through a worker thread
        assert async_token is not None
        assert async_busy is False
        survivor, casualty = Lock("survivor", timeout=15), Lock("casualty", timeout=15)
        assert survivor.acquire()
        assert casualty.acquire()
        old_fence = casualty.fencing_token
        assert old_fence is not None
        with sentinel_group.primary.client() as primary:
            assert primary.execute_command("WAIT", 1, 5000) == 1
        assert sentinel_group.replica is not None
        with sentinel_group.replica.client() as replica:
            replica.config_set("replica-read-only", "no")
            replica.delete("redislock:{casualty}:lock")
            assert replica.exists("redislock:{survivor}:lock")

        sentinel_group.primary.kill()
        wait_until(
            lambda: sentinel_group.primary_port() == sentinel_group.replica.port,  # type: ignore[union-attr]
            "the sentinels to promote the replica",
            timeout=30,
        )

        # New acquisitions work on the new primary, once the client finds it (the
        # sentinels may answer "no master" for a moment after the promotion).
        wait_until(
            lambda: _answers(lambda: not Lock("probe").locked()),
            "the client to find the new primary",
        )
        with Lock("fresh", blocking_timeout=10) as fresh:
            assert fresh.owned()
        # The replicated lock is still exclusive, and its holder still holds it.
        assert other_thread(Lock("survivor").acquire, blocking=False) is False
        wait_until(
            lambda: _answers(survivor.owned), "the survivor's connection to reach the new primary"
        )
        # The lost lock is free for others, with a larger fencing token...
        other = Lock("casualty", blocking_timeout=10)
        assert other_thread(other.acquire)
        new_fence = other_thread(lambda: other.fencing_token)
        assert new_fence is not None
        assert new_fence > old_fence
        # ...and its old holder is told, never left believing it holds it.
        wait_until(lambda: any(c["name"] == "casualty" for c in lost), "lock_lost", timeout=25)
        assert not casualty.owned()
        with pytest.raises(LockLostError):
            casualty.release()
        other_thread(other.release)
        survivor.release()
        assert [c["name"] for c in lost] == ["casualty"]


def _answers(check: Callable[[], bool]) -> bool:
    """``check()``, or ``False`` while the client still reaches for the dead primary."""
    try:
        return check()
    except LockBackendError:
        return False


async def _async_round() -> tuple[int | None, bool]:
    lock = AsyncLock("async")
    async with lock:
        busy = await asyncio.create_task(AsyncLock("async").acquire(blocking=False))
        return lock.fencing_token, busy


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"SENTINELS": [("127.0.0.1", 26379)]}, "CONNECTION_FACTORY"),
        ({"CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory"}, "SENTINELS"),
    ],
)
def test_system_check_reports_an_incomplete_sentinel_cache(
    options: dict[str, object], problem: str
) -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://mymaster/0",
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient", **options},
        }
    }
    with override_settings(CACHES=caches):
        errors = [m for m in run_checks() if m.id == "django_redislock.E021"]
    assert len(errors) == 1
    assert problem in errors[0].msg


def test_system_check_accepts_a_complete_sentinel_cache() -> None:
    cache = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://mymaster/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "SENTINELS": [("127.0.0.1", 26379)],  # checks never connect
        },
    }
    with override_settings(
        CACHES={"default": cache},
        DJANGO_REDIS_CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
    ):
        assert not [m for m in run_checks() if m.id == "django_redislock.E021"]
