"""A small shop that shows django-redislock.

With ``REDIS_URL`` set it uses that Redis. Without, ``embedded_redis`` starts
fakeredis's TCP server in-process (announced once by ``runserver``) so the shop
runs on a machine with no Redis at all; other commands of the project find it,
and a gunicorn or uvicorn worker refuses to start without ``REDIS_URL``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-shop-not-secret")
DEBUG = True
# Every loopback name, as Django allows with DEBUG and no ALLOWED_HOSTS.
ALLOWED_HOSTS = ["127.0.0.1", ".localhost", "[::1]"]

INSTALLED_APPS = [
    # First, so that its runserver (which says which Redis the shop uses)
    # overrides staticfiles' one.
    "example_project.shop",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The admin's CSS and the dashboard's JS under gunicorn or uvicorn too, not
    # only under runserver (the shop extra installs WhiteNoise: see below).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Describe every lock a request takes by its method and path (the dashboard's "holder").
    "django_redislock.context.HolderContextMiddleware",
    # A lock error a view lets through answers 409 or 503, never a 500.
    "django_redislock.middleware.LockErrorMiddleware",
]

ROOT_URLCONF = "example_project.urls"
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
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DATABASE", str(BASE_DIR / "db.sqlite3")),
        # oversell_demo runs several processes on this file: WAL lets readers
        # run beside the one writer. (With ATOMIC_REQUESTS also set
        # "transaction_mode": "IMMEDIATE": see docs/inventory.md, "SQLite".)
        "OPTIONS": {"timeout": 30},
    }
}
if django.VERSION >= (5, 1):  # SQLite's init_command arrived in Django 5.1
    DATABASES["default"]["OPTIONS"]["init_command"] = (  # type: ignore[index]
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
# Not Django's default (America/Chicago): the orders page, the dashboard and
# runserver's log show UTC, as stored (the orders page labels it).
TIME_ZONE = "UTC"
STATIC_URL = "/static/"
# ``manage.py collectstatic`` writes here, and WhiteNoise serves what it finds
# here with far-future caching. Without a collectstatic run it serves the apps'
# own static files straight from their folders (WHITENOISE_USE_FINDERS), so the
# demo needs no build step; a deployment runs collectstatic (docs/operations.md).
STATIC_ROOT = os.environ.get("SHOP_STATIC_ROOT", str(BASE_DIR / "staticfiles"))
WHITENOISE_USE_FINDERS = True
if importlib.util.find_spec("whitenoise") is None:  # the test extra alone (scripts/matrix)
    MIDDLEWARE.remove("whitenoise.middleware.WhiteNoiseMiddleware")

from example_project.embedded_redis import redis_url  # noqa: E402

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_url(),
        "OPTIONS": {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5},
    }
}
REDISLOCK = {"TIMEOUT": 10.0, "BLOCKING_TIMEOUT": 2.0}
