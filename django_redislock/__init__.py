"""django-redislock: safe mutual exclusion across processes on your django-redis connection.

Importing this package touches neither settings nor Redis, and imports no
models, so ``from django_redislock import Lock`` works before apps are ready.
"""

from __future__ import annotations

from .async_locks import AsyncLock
from .exceptions import (
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)
from .locks import Lock
from .rwlock import AsyncReadWriteLock, ReadWriteLock
from .semaphores import AsyncSemaphore, Semaphore

__all__ = [
    "AsyncLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "Lock",
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeout",
    "ReadWriteLock",
    "Semaphore",
]
