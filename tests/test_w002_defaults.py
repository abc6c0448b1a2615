"""W002 says what the installed redis-py really does with no socket timeouts.

On redis-py 8 it read "a hung Redis would block ... for redis-py's default of
5 s per command" and hinted to add 5 s timeouts: what redis-py already did,
so the warning read as noise. It now names the installed version's real
defaults (read from a new connection) and why setting them still matters.
"""

from __future__ import annotations

import pytest
import redis
from django.test import override_settings

from django_redislock.checks import check_settings

BARE = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}


def w002() -> tuple[str, str]:
    caches = {"default": BARE}
    with override_settings(CACHES=caches, REDISLOCK={}):
        [message] = [m for m in check_settings() if m.id == "django_redislock.W002"]
    return message.msg, str(message.hint)


def test_w002_names_the_installed_redis_pys_real_defaults() -> None:
    connection = redis.Connection()  # unconnected: what an unset timeout means
    connect, command = connection.socket_connect_timeout, connection.socket_timeout
    msg, hint = w002()
    assert f"redis-py {redis.__version__}" in msg
    if connect and command:  # redis-py 8 on
        assert f"defaults ({connect:g} s to connect, {command:g} s per command)" in msg
        assert "redis-py before 8 has none" in msg
        assert hint.startswith("Set them in its OPTIONS to keep a bound whatever the redis-py")
    else:
        assert "until the operating system gives up on the connection" in msg
        assert f"redis-py {redis.__version__} has no default timeout" in msg
        assert hint.startswith("Add to its OPTIONS:")
    assert "{'SOCKET_CONNECT_TIMEOUT': 5, 'SOCKET_TIMEOUT': 5}" in hint


@pytest.mark.parametrize(
    ("connect", "command", "expected"),
    [
        (5, 5, "defaults (5 s to connect, 5 s per command)"),
        (None, None, "has no default timeout"),
        (2.5, None, "has no default timeout"),  # a bound on connecting only bounds nothing after
    ],
)
def test_w002_follows_what_a_connection_gets(
    monkeypatch: pytest.MonkeyPatch, connect: float | None, command: float | None, expected: str
) -> None:
    real = redis.Connection

    def connection(*args: object, **kwargs: object) -> redis.Connection:
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        made.socket_connect_timeout, made.socket_timeout = connect, command
        return made

    monkeypatch.setattr("redis.Connection", connection)
    assert expected in w002()[0]
