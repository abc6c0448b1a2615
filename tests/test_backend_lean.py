"""The hot path: scripts and BLPOP written straight to a pooled connection.

It must behave like redis-py's own path in everything but speed: the same
replies and errors, a stale connection replaced, a connection never left out
of step with its replies.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import redis

from django_redislock import Lock, backend

FIRST = "return 'first'"
SECOND = "return 'second'"


@pytest.fixture
def client() -> Any:
    return backend.get_client("default")


def sha_of(client: Any, script: str) -> bytes:
    return str(client.script_load(script)).encode()


def connected_clients(client: redis.Redis) -> int:
    return len(client.client_list(_type="normal"))


def test_replies_match_redis_pys(client: Any) -> None:
    sha = sha_of(client, "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1, ARGV[3]}")
    expected = client.evalsha(sha, 1, "k", "välue", 41, 2.5)
    assert backend.evalsha(client, sha, ["k"], ["välue", 41, 2.5]) == expected
    assert expected == [b"k", "välue".encode(), 42, b"2.5"]


def test_a_connection_the_server_closed_is_replaced(client: Any, redis_client: redis.Redis) -> None:
    lock = Lock("stale")
    assert lock.acquire()
    lock.release()  # the pool now keeps a connection
    assert redis_client.client_kill_filter(_type="normal", skipme=True) >= 1
    assert lock.acquire()  # the dead connection is noticed and replaced
    lock.release()
    assert not lock.locked()


COUNT = "return redis.call('INCR', KEYS[1])"


def test_a_command_that_could_not_be_written_is_sent_again(
    client: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = sha_of(client, COUNT)
    real_send = redis.connection.Connection.send_packed_command
    failed: list[bool] = []

    def fail_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            self.disconnect()
            raise redis.ConnectionError("Error 32 while writing to socket. Broken pipe.")
        return real_send(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", fail_once)
    assert backend.evalsha(client, sha, ["runs"], []) == 1
    assert failed and redis_client.get("runs") == b"1"


def test_a_lost_reply_is_raised_not_run_twice(
    client: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script ran; only its reply was lost. A second run would be a second
    effect (a release reported as lost, a try-acquire refused by its own grant)."""
    sha = sha_of(client, COUNT)
    real_read = redis.connection.Connection.read_response
    dropped: list[bool] = []

    def drop_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not dropped:
            dropped.append(True)
            real_read(self, *args, **kwargs)  # the server answered...
            self.disconnect()
            raise redis.ConnectionError("Connection closed by server.")  # ...we never saw it
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "read_response", drop_once)
    with pytest.raises(redis.ConnectionError):
        backend.evalsha(client, sha, ["runs"], [])
    assert redis_client.get("runs") == b"1"
    assert backend.evalsha(client, sha, ["runs"], []) == 2  # and the pool still works


def test_an_error_reply_is_raised_and_the_connection_stays_in_step(
    client: Any, redis_client: redis.Redis
) -> None:
    failing = sha_of(client, "return redis.error_reply('boom')")
    second = sha_of(client, SECOND)
    backend.evalsha(client, second, ["k"], [])
    before = connected_clients(redis_client)
    with pytest.raises(redis.ResponseError, match="boom"):
        backend.evalsha(client, failing, ["k"], [])
    assert backend.evalsha(client, second, ["k"], []) == b"second"
    assert connected_clients(redis_client) == before  # the same connection, reused


def test_an_interrupted_reply_never_answers_a_later_command(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = sha_of(client, FIRST), sha_of(client, SECOND)
    real_read = redis.connection.Connection.read_response
    interrupted: list[bool] = []

    def interrupt_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # Ctrl-C after the command went out
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "read_response", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        backend.evalsha(client, first, ["k"], [])
    # Had the connection gone back to the pool as it was, this would read 'first'.
    assert backend.evalsha(client, second, ["k"], []) == b"second"


def test_clients_without_a_plain_pool_use_redis_pys_path(redis_url: str) -> None:
    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        sha = sha_of(single, SECOND)
        assert backend.evalsha(single, sha, ["k"], []) == b"second"
        assert backend.blpop(single, "nothing", 0.05) is None
    finally:
        single.close()


def test_a_pool_connection_is_taken_past_only_redis_pys_deprecation_check(
    redis_url: str,
) -> None:
    """The pool's own work (accounting, health check) still runs; a decorator
    other than redis-py's deprecation check is never skipped."""
    seen: list[str] = []

    def traced(method: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(method.__name__)
            return method(self, *args, **kwargs)

        wrapper.__wrapped__ = method  # type: ignore[attr-defined]
        return wrapper

    class TracedPool(redis.ConnectionPool):
        get_connection = traced(redis.ConnectionPool.get_connection)

    for pool in (redis.ConnectionPool.from_url(redis_url), TracedPool.from_url(redis_url)):
        conn = backend._pool_connection(pool)
        try:
            assert conn in pool._in_use_connections
        finally:
            pool.release(conn)
        assert conn in pool._available_connections
        pool.disconnect()
    assert seen == ["get_connection"]


def test_a_get_connection_patched_on_the_pool_is_used(client: Any) -> None:
    """Instrumentation or a test double set on the pool itself is never bypassed."""
    sha = sha_of(client, SECOND)
    pool = client.connection_pool
    with mock.patch.object(pool, "get_connection", side_effect=redis.ConnectionError("down")):
        with pytest.raises(redis.ConnectionError, match="down"):
            backend.evalsha(client, sha, ["k"], [])
        assert pool.get_connection.called
    assert backend.evalsha(client, sha, ["k"], []) == b"second"


def test_blpop_returns_key_and_value_or_none(client: Any, redis_client: redis.Redis) -> None:
    redis_client.rpush("signal", "1")
    assert backend.blpop(client, "signal", 1.0) == (b"signal", b"1")
    assert backend.blpop(client, "signal", 0.05) is None


@pytest.mark.parametrize("odd", [True, memoryview(b"x"), None, object()])
def test_arguments_only_redis_py_can_encode_are_left_to_it(odd: object) -> None:
    assert backend._pack((b"EVALSHA", b"0" * 40, 0, odd)) is None


def test_a_template_packs_the_same_bytes_as_a_whole_command() -> None:
    template = backend.Template((b"EVALSHA", b"0" * 40, 2, b"k1", "k2", None, 7, None, b"x"))
    filled = template.fill(b"token", b"1234")
    whole = (b"EVALSHA", b"0" * 40, 2, b"k1", "k2", b"token", 7, b"1234", b"x")
    assert filled == backend._pack(whole)
    with pytest.raises(TypeError):
        backend.Template((b"EVALSHA", True, None))


@pytest.mark.parametrize("holes", [1, 2, 3])
def test_a_template_keeps_percent_signs_and_fills_any_number_of_holes(holes: int) -> None:
    """Its fixed parts become one %-format: a key with ``%`` in it must survive."""
    fixed = [b"EVALSHA", b"0" * 40, 1, "key%d%s%%", b"100%"]
    values = [b"v%d" % i + b"%s" * i for i in range(holes)]
    template = backend.Template((*fixed, *[None] * holes))
    assert template.fill(*values) == backend._pack((*fixed, *values))
    with pytest.raises(ValueError, match="holes"):
        template.fill(*values, b"one too many")


def test_lock_and_semaphore_calls_from_templates_work(redis_client: redis.Redis) -> None:
    """The pre-packed acquire and release calls reach Redis as the scripts expect."""
    from django_redislock import Semaphore

    lock = Lock("templated")
    for _ in range(3):  # the first builds the templates, the rest reuse them
        with lock:
            assert redis_client.exists("redislock:{templated}:lock")
        assert not lock.locked()
    sem = Semaphore("templated", 2)
    for _ in range(3):
        with sem:
            assert redis_client.zcard("redislock:{templated}:semaphore") == 1
        assert redis_client.zcard("redislock:{templated}:semaphore") == 0
