"""Minimal Django settings for the benchmark: the default cache is the private server.

``bench.workers.setup_django`` sets ``REDISLOCK_BENCH_REDIS_URL`` before Django
is set up, in the coordinator, every worker process and the probes.
"""

from __future__ import annotations

import os

SECRET_KEY = "django-redislock-bench-not-secret"
USE_TZ = True
INSTALLED_APPS = ["django_redislock"]
DATABASES: dict[str, object] = {}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("REDISLOCK_BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}
