"""Every command goes through redis-py's public path, where tracing sees it.

OpenTelemetry's and Sentry's redis integrations wrap ``Redis.execute_command``
and ``Pipeline.execute``; a django-redis client subclass may override
``execute_command`` (namespacing, circuit breakers). A lock's acquire, wait,
renewal and release must all pass there, sync and async.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock import AsyncLock, Lock, Redlock, Semaphore
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE
from tests.settings import redis_cache
from tests.support.clients import ASYNC_CLIENT, CLIENT, LIB, VALKEY
from tests.support.other_holders import OtherThread
from tests.support.scaleout import RedlockServers
from tests.support.servers import RedisServer


class Tracer:
    """What a tracing integration records: one entry per command, by name."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self._lock = threading.Lock()

    def record(self, name: object) -> None:
        text = name.decode() if isinstance(name, bytes) else str(name)
        with self._lock:
            self.commands.append(text.upper())

    def count(self, name: str) -> int:
        return self.commands.count(name)


@pytest.fixture
def tracer(monkeypatch: pytest.MonkeyPatch, _scripts_loaded: None) -> Tracer:
    tracer = Tracer()
    sync_execute = CLIENT.execute_command
    async_execute = ASYNC_CLIENT.execute_command
    pipeline = LIB.client.Pipeline
    pipeline_execute = pipeline.execute

    def traced(self: Any, *args: Any, **options: Any) -> Any:
        tracer.record(args[0])
        return sync_execute(self, *args, **options)

    async def traced_async(self: Any, *args: Any, **options: Any) -> Any:
        tracer.record(args[0])
        return await async_execute(self, *args, **options)

    def traced_pipeline(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracer.record("PIPELINE")
        return pipeline_execute(self, *args, **kwargs)

    monkeypatch.setattr(CLIENT, "execute_command", traced)
    monkeypatch.setattr(ASYNC_CLIENT, "execute_command", traced_async)
    monkeypatch.setattr(pipeline, "execute", traced_pipeline)
    return tracer


@pytest.fixture(autouse=True)
def _scripts_loaded() -> None:
    """Load the scripts first: a ``NOSCRIPT`` reply (a new server) costs a second call."""
    with Lock("warm-up"), Semaphore("warm-up", 1):
        pass


def test_a_tracer_sees_acquire_wait_renew_and_release(
    tracer: Tracer, other_thread: OtherThread
) -> None:
    holder = Lock("traced", timeout=1.5)
    other_thread(holder.acquire)
    # the acquire: a plain SET NX PX, no script
    assert (tracer.count("SET"), tracer.count("EVALSHA")) == (1, 0)
    waiter = Lock("traced", blocking_timeout=0.3)
    assert waiter.acquire() is False  # queued, waited, gave up
    assert tracer.count("BLPOP") >= 1  # the wait
    evalsha_before = tracer.count("EVALSHA")
    deadline = time.monotonic() + 5  # the watchdog renews a third of the way into the lease
    while tracer.count("EVALSHA") == evalsha_before:
        assert time.monotonic() < deadline, "no renewal was traced"
        time.sleep(0.02)
    other_thread(holder.release)
    assert tracer.commands[-1] == "EVALSHA"  # the release


def test_a_tracer_sees_async_locks_and_semaphores(tracer: Tracer) -> None:
    async def main() -> None:
        async with AsyncLock("traced-async"):
            pass

    asyncio.run(main())
    assert tracer.count("SET") == 1  # the acquire: a plain SET NX PX
    assert tracer.count("EVALSHA") == 1  # the release
    with Semaphore("traced-sem", 2):
        pass
    assert tracer.count("EVALSHA") == 3


def test_a_client_subclass_execute_command_is_used(redis_url: str) -> None:
    """A django-redis ``REDIS_CLIENT_CLASS`` (django-valkey's ``BASE_CLIENT_CLASS``)
    that overrides ``execute_command``."""
    from django.test import override_settings

    from tests.settings import redis_cache

    option = "BASE_CLIENT_CLASS" if VALKEY else "REDIS_CLIENT_CLASS"
    caches = {
        "default": redis_cache(
            redis_url,
            **{option: "tests.backend.test_scripts.Counting"},
        )
    }
    Counting.seen = []
    with override_settings(CACHES=caches):
        with Lock("subclassed"):
            pass
    assert Counting.seen == ["SET", "EVALSHA"]  # the acquire's SET NX PX, the release


class Counting(CLIENT):  # type: ignore[misc,valid-type]
    seen: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        Counting.seen.append(str(args[0]).upper())
        return super().execute_command(*args, **options)


def test_a_script_the_server_forgot_is_loaded_again(redis_client: redis.Redis) -> None:
    with Lock("reload"):
        redis_client.script_flush()  # a restart, or SCRIPT FLUSH
    assert not Lock("reload").locked()
    assert redis_client.script_exists(LOCK_RELEASE.sha) == [True]


def test_an_interrupted_reply_never_answers_a_later_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C while a reply is being read: redis-py's own path drops that
    connection, so the reply can never be read as the answer to a later command."""
    import socket

    real_recv = socket.socket.recv
    interrupted: list[bool] = []

    def interrupt_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # Ctrl-C after the command went out
        return real_recv(self, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "recv", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        Lock("interrupted").acquire()
    monkeypatch.undo()
    assert interrupted
    with Lock("second") as lock:
        assert lock.owned()
    assert not Lock("interrupted").locked()  # the interrupted acquire was undone


#: What a tracing integration keeps in a context variable: the current span.
SPAN: contextvars.ContextVar[str | None] = contextvars.ContextVar("span", default=None)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Each command with the span current where it was sent, as OpenTelemetry's
    redis instrumentation sees it: a command sent without the caller's
    context is a trace of its own, missing from the request's."""
    seen: list[tuple[str, str | None]] = []
    sync_execute = CLIENT.execute_command
    async_execute = ASYNC_CLIENT.execute_command

    def traced(self: Any, *args: Any, **options: Any) -> Any:
        seen.append((str(args[0]).upper(), SPAN.get()))
        return sync_execute(self, *args, **options)

    async def traced_async(self: Any, *args: Any, **options: Any) -> Any:
        seen.append((str(args[0]).upper(), SPAN.get()))
        return await async_execute(self, *args, **options)

    monkeypatch.setattr(CLIENT, "execute_command", traced)
    monkeypatch.setattr(ASYNC_CLIENT, "execute_command", traced_async)
    return seen


def in_span(run: Any) -> None:
    """``run()`` under the span ``"request"``, in a context of its own."""

    def under() -> None:
        SPAN.set("request")
        run()

    contextvars.copy_context().run(under)


@pytest.mark.scaleout
def test_a_redlock_s_commands_are_sent_in_the_caller_s_context(
    redlock_servers: RedlockServers, spans: list[tuple[str, str | None]]
) -> None:
    """Each server's call is made by a worker thread, in the caller's context."""

    def use() -> None:
        with Redlock("traced-redlock", auto_renew=False):
            pass

    in_span(use)
    assert sum(command == "EVALSHA" for command, _ in spans) >= 6  # a majority, twice
    assert {span for _, span in spans} == {"request"}


def test_commands_bounded_on_a_worker_are_sent_in_the_caller_s_context(
    redis_server_factory: Callable[[], RedisServer], spans: list[tuple[str, str | None]]
) -> None:
    """A pool with no plain sibling (Sentinel, Cluster, a class of one's own):
    a step bounded by ``blocking_timeout`` runs on a worker thread."""
    from django.test import override_settings

    # a server of its own: django-redis shares one pool per URL, whatever its class
    url = redis_server_factory().url
    spans.clear()  # the server's start-up checks
    cache = redis_cache(url, CONNECTION_POOL_CLASS="tests.engine.test_hung_server.OwnPool")

    def use() -> None:
        with Lock("traced-bounded", blocking_timeout=1):
            pass

        async def use_async() -> None:
            async with AsyncLock("traced-bounded", blocking_timeout=1):
                pass

        asyncio.run(use_async())

    with override_settings(CACHES={"default": cache}):
        in_span(use)
    assert sum(command == "EVALSHA" for command, _ in spans) >= 2  # each acquire
    assert {span for _, span in spans} == {"request"}


def test_a_lease_in_its_last_millisecond_gives_a_retry_hint(redis_client: redis.Redis) -> None:
    # PTTL says 0 in a lease's last millisecond; a hint of 0 reads as none,
    # and a waiter given none re-checks only after a whole wait chunk (2 s),
    # long after the lease ran out. Leases of 1 ms put many attempts there.
    key = "redislock:{last-ms}:lock"
    args = LOCK_ACQUIRE.args_of(
        token="b" * 32, lease_ms=30_000, mode="try", fenced="0", holder="test",
        since_ms=0, waiter_ttl_ms=10_000, stats_ttl_ms=0,
    )  # fmt: skip
    hints = []
    for _ in range(300):
        redis_client.set(key, "a" * 32 + ":0:1:0:1:0:test", px=1)
        reply = LOCK_ACQUIRE(redis_client, [key], args)
        code = reply[0] if isinstance(reply, list) else reply
        if code < -1:
            hints.append(-2 - code)
        redis_client.delete(key)
    assert hints, "no attempt found the lock still held"
    assert min(hints) >= 1
