"""django-redislock: safe mutual exclusion across processes on your django-redis connection.

Importing this package touches neither settings nor Redis, and imports no
models, so ``from django_redislock import Lock`` works before apps are ready.
``Redlock`` is imported on first use: a site that never uses it never loads its
quorum code and per-server thread pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_redislock.backend.values import HolderInfo
from django_redislock.decorators import require_lock, require_slot
from django_redislock.exceptions import (
    InsufficientStock,
    LockBackendError,
    LockBackendTimeout,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockPoolExhausted,
    LockTimeout,
)
from django_redislock.fencing import FenceField, fenced_update
from django_redislock.once import idempotent
from django_redislock.primitives.async_leadership import AsyncLeadership
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.leadership import Leadership
from django_redislock.primitives.lock import Lock
from django_redislock.primitives.multilock import MultiLock
from django_redislock.primitives.rwlock import AsyncReadWriteLock, ReadWriteLock
from django_redislock.primitives.semaphore import AsyncSemaphore, Semaphore
from django_redislock.single_run import ALREADY_RUNNING, single_run

if TYPE_CHECKING:
    from django_redislock.primitives.redlock import Redlock

__all__ = [
    "ALREADY_RUNNING",
    "AsyncLeadership",
    "AsyncLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "FenceField",
    "HolderInfo",
    "InsufficientStock",
    "Leadership",
    "Lock",
    "LockBackendError",
    "LockBackendTimeout",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockPoolExhausted",
    "LockTimeout",
    "MultiLock",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "fenced_update",
    "idempotent",
    "require_lock",
    "require_slot",
    "single_run",
]


def __getattr__(name: str) -> Any:
    if name == "Redlock":
        from django_redislock.primitives.redlock import Redlock

        return Redlock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
