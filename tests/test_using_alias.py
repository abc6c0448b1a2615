"""A ``using=`` alias that is not in ``CACHES`` fails where every other bad
argument does: when the lock is built or the decorator applied, not at the
first acquire (which a view answered with a 500)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings

from django_redislock import (
    AsyncLock,
    Lock,
    ReadWriteLock,
    Semaphore,
    require_lock,
    require_slot,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Lock("x", using="nope"),
        lambda: AsyncLock("x", using="nope"),
        lambda: Semaphore("x", 2, using="nope"),
        lambda: ReadWriteLock("x", using="nope"),
    ],
)
def test_an_unknown_alias_fails_when_the_primitive_is_built(build: object) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        build()  # type: ignore[operator]
    message = str(info.value)
    assert "using='nope'" in message and "'default'" in message, message


def test_an_unknown_alias_fails_when_the_decorator_is_applied() -> None:
    with pytest.raises(ImproperlyConfigured, match="using='nope'"):
        require_lock("sku:<pk>", using="nope")
    with pytest.raises(ImproperlyConfigured, match="using='nope'"):
        require_slot("export:<pk>", limit=2, using="nope")


def test_an_alias_added_by_override_settings_is_accepted(redis_url: str) -> None:
    from tests.settings import redis_cache

    with override_settings(CACHES={"default": redis_cache(redis_url), "b": redis_cache(redis_url)}):
        with Lock("x", using="b") as lock:
            assert lock.owned()


def test_a_view_decorated_before_the_alias_exists_answers_503_not_500() -> None:
    """The decorator checks at application; a view whose alias disappeared
    (or that was decorated before the settings were ready) meets it at the
    call: a 503 and an ERROR line, never a 500."""
    from django.conf import settings

    with override_settings(CACHES={**settings.CACHES, "gone": settings.CACHES["default"]}):

        @require_lock("sku:<pk>", using="gone")
        def buy(request: object, pk: int) -> object:
            raise AssertionError("ran without its lock")

    answer = buy(RequestFactory().post("/buy/1/"), pk=1)
    assert answer.status_code == 503 and answer["Retry-After"] == "5"
    with pytest.raises(ImproperlyConfigured, match="using='gone'"):
        buy(None, pk=1)  # not a view call: the error itself


CHILD = """
from django_redislock import require_lock, Lock

@require_lock("sku:<pk>", using="nope")   # settings not configured yet: accepted
def buy(request, pk):
    raise AssertionError("ran without its lock")

lock = Lock("x", using="nope")             # the same for a primitive

import django
from django.conf import settings
settings.configure(
    CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                        "LOCATION": "redis://127.0.0.1:1/0"}},
    INSTALLED_APPS=["django_redislock"], ALLOWED_HOSTS=["*"],
)
django.setup()
from django.test import RequestFactory
answer = buy(RequestFactory().post("/buy/1/"), pk=1)
print(answer.status_code, answer["Retry-After"])
try:
    lock.acquire()
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_before_settings_are_ready_the_alias_is_checked_at_the_first_call() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    status, error = done.stdout.splitlines()
    assert status == "503 5", done.stdout
    assert error.startswith("ImproperlyConfigured") and "'nope'" in error, error
    assert "Cannot take a lock under POST /buy/1/" in done.stderr, done.stderr
