"""django-redislock: safe mutual exclusion across processes on your django-redis connection.

Importing this package touches neither settings nor Redis, and imports no
models, so ``from django_redislock import Lock`` works before apps are ready.
"""

from __future__ import annotations

from .async_locks import AsyncLock
from .commands import ALREADY_RUNNING, single_run
from .decorators import require_lock
from .exceptions import (
    InsufficientStock,
    LockBackendError,
    LockBackendTimeout,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)
from .fencing import FenceField, fenced_update
from .locks import Lock
from .multilock import MultiLock
from .redlock import Redlock
from .rwlock import AsyncReadWriteLock, ReadWriteLock
from .semaphores import AsyncSemaphore, Semaphore
from .state import HolderInfo

__all__ = [
    "ALREADY_RUNNING",
    "AsyncLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "FenceField",
    "HolderInfo",
    "InsufficientStock",
    "Lock",
    "LockBackendError",
    "LockBackendTimeout",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeout",
    "MultiLock",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "fenced_update",
    "require_lock",
    "single_run",
]
