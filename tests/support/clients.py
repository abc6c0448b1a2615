"""The client library under test: redis-py (django-redis) or valkey-py
(django-valkey, ``REDISLOCK_TEST_CACHE=django-valkey``), for tests that
check which error or class the library handed back.

A lock on a django-valkey cache sees valkey-py's errors, never redis-py's:
``LIB.ConnectionError`` is the one its ``LockBackendError`` chains.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from tests.settings import CACHE_LIBRARY

#: ``redis`` or ``valkey``: the top-level module of the library under test.
LIB: ModuleType = importlib.import_module("valkey" if CACHE_LIBRARY == "django-valkey" else "redis")
for _part in ("backoff", "client", "retry"):  # LIB.retry.Retry and the like
    importlib.import_module(f"{LIB.__name__}.{_part}")
#: ``redis.asyncio`` or ``valkey.asyncio``.
LIB_ASYNC: ModuleType = importlib.import_module(f"{LIB.__name__}.asyncio")
#: ``redis.Redis`` or ``valkey.Valkey``: the sync client class.
CLIENT = LIB.Valkey if LIB.__name__ == "valkey" else LIB.Redis
#: The asyncio client class.
ASYNC_CLIENT = LIB_ASYNC.Valkey if LIB.__name__ == "valkey" else LIB_ASYNC.Redis
VALKEY = LIB.__name__ == "valkey"
