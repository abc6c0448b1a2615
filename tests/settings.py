"""Django settings for the test suite.

The Redis URL comes from ``REDISLOCK_TEST_REDIS_URL``, which ``conftest.py``
sets once it has started the session's private server, so worker processes
spawned by the tests find the same server. ``DATABASE_URL`` (postgres://...)
switches the database from SQLite to PostgreSQL.
"""

from __future__ import annotations

import os
import tempfile
from importlib.util import find_spec
from urllib.parse import unquote, urlparse

SECRET_KEY = "django-redislock-tests-not-secret"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
    "tests",
]

#: Django 6.0+'s tasks (tests/support/django_tasks.py), run where they are enqueued;
#: older Django ignores the setting.
TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}

#: django-tasks-db's database backend and its ``db_worker``, where Django has
#: django.tasks and the package is installed (the enqueue-once tests with a real
#: worker: tests/once/test_enqueue_once_db_worker.py).
if find_spec("django.tasks") and find_spec("django_tasks_db"):
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

STATIC_URL = "/static/"


def database_from_url(url: str) -> dict[str, object]:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be postgres://..., got {url!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        # Django's default is "test_" + NAME; two runs at once need two names
        # (scripts/matrix runs beside scripts/test in CI).
        "TEST": {"NAME": os.environ.get("REDISLOCK_TEST_DATABASE") or None},
    }


_sqlite_dir = os.environ.setdefault(
    "REDISLOCK_TEST_SQLITE_DIR", tempfile.mkdtemp(prefix="redislock-sqlite-")
)
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(_sqlite_dir, "db.sqlite3"),
            # A file, not :memory:, so that worker processes share the test database.
            "TEST": {"NAME": os.path.join(_sqlite_dir, "test.sqlite3")},
            "OPTIONS": {"timeout": 30},
        }
    }

REDIS_URL = os.environ.get("REDISLOCK_TEST_REDIS_URL", "redis://127.0.0.1:1/0")


#: ``REDISLOCK_TEST_CACHE=django-valkey``: every cache ``redis_cache`` makes is
#: django-valkey's ``ValkeyCache`` on valkey-py (scripts/test's Valkey run),
#: with the same options, which django-valkey spells as django-redis does.
CACHE_LIBRARY = os.environ.get("REDISLOCK_TEST_CACHE", "django-redis")
if CACHE_LIBRARY not in ("django-redis", "django-valkey"):
    raise ValueError(f"REDISLOCK_TEST_CACHE: django-redis or django-valkey, not {CACHE_LIBRARY!r}")
_BACKENDS = {
    "django-redis": ("django_redis.cache.RedisCache", "django_redis.client.DefaultClient"),
    "django-valkey": ("django_valkey.cache.ValkeyCache", "django_valkey.client.DefaultClient"),
}


def redis_cache(url: str, **options: object) -> dict[str, object]:
    """A django-redis cache on ``url`` (django-valkey's, under
    ``REDISLOCK_TEST_CACHE=django-valkey``); ``SOCKET_TIMEOUT=None`` means none at
    all: django-redis leaves a ``None`` out, and redis-py 8 then gives the
    connection a 5 s socket timeout of its own, so the pool is given ``None``."""
    pool_kwargs: dict[str, None] = {}
    for option, kwarg in (("SOCKET_TIMEOUT", "socket_timeout"),
                          ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout")):  # fmt: skip
        if option in options and options[option] is None:
            pool_kwargs[kwarg] = None
    if pool_kwargs:
        options.setdefault("CONNECTION_POOL_KWARGS", pool_kwargs)
    backend, client = _BACKENDS[CACHE_LIBRARY]
    return {
        "BACKEND": backend,
        "LOCATION": url,
        "OPTIONS": {
            "CLIENT_CLASS": client,
            "SOCKET_CONNECT_TIMEOUT": 5,
            "SOCKET_TIMEOUT": 5,
            **options,
        },
    }


CACHES = {
    "default": redis_cache(REDIS_URL),
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}
