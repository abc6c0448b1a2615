"""The lock speaks the client family it was given: redis-py to django-redis's
clients, valkey-py to django-valkey's (``backend/family.py``).

These run in every phase, on the session's server whatever it is (the Valkey
run of scripts/test runs the whole core suite through django-valkey besides):
what is checked here is the client library, not the server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import valkey
import valkey.asyncio
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from django_redislock import AsyncLock, Lock, LockBackendError, LockTimeout
from django_redislock.backend import aio as async_clients
from django_redislock.backend import client as backend
from django_redislock.backend import family
from tests.support.other_holders import OtherThread
from tests.support.servers import free_port

VALKEY_CACHE = "django_valkey.cache.ValkeyCache"
REDIS_CACHE = "django_redis.cache.RedisCache"


def cache(backend_path: str, url: str, **options: Any) -> dict[str, Any]:
    client = "django_valkey.client" if backend_path == VALKEY_CACHE else "django_redis.client"
    return {
        "BACKEND": backend_path,
        "LOCATION": url,
        "OPTIONS": {
            "CLIENT_CLASS": f"{client}.DefaultClient",
            "SOCKET_TIMEOUT": 5,
            "SOCKET_CONNECT_TIMEOUT": 5,
            **options,
        },
    }


@contextmanager
def both_caches(url: str) -> Iterator[None]:
    """``redis``: django-redis on ``url``; ``valkey``: django-valkey on the same
    server: a site half-way through its switch from one to the other."""
    caches = {"redis": cache(REDIS_CACHE, url), "valkey": cache(VALKEY_CACHE, url)}
    with override_settings(CACHES={**caches, "default": caches["valkey"]}):
        yield


def test_each_client_is_of_its_own_family(redis_url: str) -> None:
    with both_caches(redis_url):
        on_valkey = backend.get_client("valkey")
        on_redis = backend.get_client("redis")
    assert isinstance(on_valkey, valkey.Valkey)
    assert family.of(on_valkey).name == "valkey"
    assert family.of(on_valkey.pipeline()).no_script_error is valkey.exceptions.NoScriptError
    assert family.of(on_redis).name == "redis"
    assert family.of(on_redis.connection_pool).connection_error is redis.ConnectionError
    assert isinstance(valkey.ConnectionError(), backend.BACKEND_ERRORS)
    assert backend.is_cluster(on_valkey) is False


def test_a_django_valkey_cache_runs_the_scripts_on_a_server_that_has_none_loaded(
    redis_url: str, other_thread: OtherThread
) -> None:
    """valkey-py answers NOSCRIPT with its own NoScriptError: the script is
    loaded then, and the call goes on (a contended acquire, its release's
    hand-off and an extend are all scripts)."""
    with both_caches(redis_url):
        client = backend.get_client("default")
        client.script_flush()
        holder = Lock("flushed", timeout=5, auto_renew=False)
        assert holder.acquire()
        client.script_flush()
        waiter = Lock("flushed")
        assert not other_thread(lambda: waiter.acquire(blocking_timeout=0.05))  # queues: a script
        holder.extend(10)
        client.script_flush()
        holder.release()
        assert not Lock("flushed").locked()


def test_an_unreachable_valkey_is_a_backend_error_with_valkey_py_s_cause() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(CACHES={"default": cache(VALKEY_CACHE, url)}):
        with pytest.raises(LockBackendError) as info:
            Lock("down").acquire()
        with pytest.raises(LockBackendError) as async_info:
            asyncio.run(AsyncLock("down").acquire())
    assert isinstance(info.value.__cause__, valkey.ConnectionError)
    assert "unreachable" in str(info.value)
    assert isinstance(async_info.value.__cause__, valkey.ConnectionError)


# django-valkey connects an async receiver to request_finished; Django before
# 5.0 calls it without awaiting it (its warning, not ours: the matrix's lowest pins)
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <coroutine object close_async_caches"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("prefix", ["decorated", "async"])
def test_a_view_on_an_unreachable_django_valkey_cache_answers_503(prefix: str) -> None:
    """valkey-py's ConnectionError is a lock outage like redis-py's: 503 with
    Retry-After, not the 500 of an error nobody caught."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    caches = {"default": cache(VALKEY_CACHE, url)}
    with override_settings(CACHES=caches, ROOT_URLCONF="tests.support.lock_views"):
        response = Client(raise_request_exception=True).get(f"/{prefix}/42/")
    assert response.status_code == 503
    assert response["Retry-After"]


def test_async_lock_on_django_valkey_runs_on_valkey_py_s_asyncio_client(redis_url: str) -> None:
    async def hold() -> Any:
        lock = AsyncLock("aio-valkey", timeout=5)
        async with lock:
            assert await lock.owned()
        return async_clients.mirror(backend.get_client("default"))[0]

    with both_caches(redis_url):
        mirror = asyncio.run(hold())
        assert not Lock("aio-valkey").locked()
    assert isinstance(mirror, valkey.asyncio.Valkey)


def test_during_a_rolling_switch_both_libraries_see_one_lock(redis_url: str) -> None:
    """Web nodes still on django-redis and nodes already on django-valkey,
    same server and key settings: the keys are the same keys. A hold taken
    through one is seen, waited for and handed off through the other, and
    the fencing tokens go on rising across them."""
    with both_caches(redis_url):
        old = Lock("sku:1", using="redis", timeout=5)
        assert old.acquire()
        first_token = old.fencing_token
        assert Lock("sku:1", using="valkey").locked()
        with pytest.raises(LockTimeout):
            with Lock("sku:1", using="valkey", blocking_timeout=0.05):
                pass
        got: list[int] = []
        waiting = threading.Event()

        def wait_on_the_new_node() -> None:
            new = Lock("sku:1", using="valkey", timeout=5, blocking_timeout=10)
            waiting.set()
            with new:
                got.append(new.fencing_token)

        waiter = threading.Thread(target=wait_on_the_new_node)
        waiter.start()
        waiting.wait(5)
        old.release()  # hands off to the waiter queued through valkey-py
        waiter.join(10)
        assert got and got[0] > first_token
        assert not Lock("sku:1", using="redis").locked()


def test_asyncio_only_and_sharded_django_valkey_caches_are_refused_at_first_use(
    redis_url: str,
) -> None:
    asyncio_only = {
        "BACKEND": "django_valkey.async_cache.cache.AsyncValkeyCache",
        "LOCATION": redis_url,
    }
    sharded = cache(VALKEY_CACHE, redis_url, CLIENT_CLASS="django_valkey.client.ShardClient")
    with override_settings(CACHES={"default": asyncio_only}):
        with pytest.raises(ImproperlyConfigured, match="E028"):
            Lock("x").acquire()
        # its close is a coroutine, which Django's sync close of the caches
        # (when the override ends) would leave unawaited
        asyncio.run(caches["default"].close())
        caches["default"].close = lambda **kwargs: None
    with override_settings(CACHES={"default": sharded}):
        with pytest.raises(ImproperlyConfigured, match="E022"):
            Lock("x").acquire()


def test_a_site_on_django_redis_never_imports_valkey_py(redis_url: str) -> None:
    """valkey-py is an extra: a lock on django-redis works without it."""
    code = (
        "import sys, django; django.setup()\n"
        "from django_redislock import Lock\n"
        "from django_redislock.backend import client\n"
        "with Lock('no-valkey', timeout=5): pass\n"
        "try:\n"
        "    raise ConnectionError('x')\n"
        "except client.BACKEND_ERRORS:\n"
        "    pass\n"
        "assert 'valkey' not in sys.modules, sorted(m for m in sys.modules if 'valkey' in m)\n"
    )
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDISLOCK_TEST_REDIS_URL": redis_url,
        "REDISLOCK_TEST_CACHE": "django-redis",
        "PATH": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
