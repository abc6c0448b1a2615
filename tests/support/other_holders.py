"""Holders other than the test's own thread.

A lock's holder is a thread (or a task), not a ``Lock`` object: a second
``Lock`` for the same name in the test's thread re-enters the test's hold.
To contend, a test runs the other holder's calls here, on a thread of its own
that lives for the whole test (so what it acquires stays its hold).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class OtherThread:
    """Runs calls, one at a time, on one thread that is not the caller's."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="other-holder")

    def __call__(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._executor.submit(func, *args, **kwargs).result(timeout=60)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def refused_elsewhere(
    name: str, primitive: Callable[[str], Any] | None = None, other: OtherThread | None = None
) -> bool:
    """Whether another holder (``other``, else a thread of its own) is
    refused ``name`` right now, by a new ``primitive`` (default ``Lock``)."""
    from django_redislock import Lock

    make = Lock if primitive is None else primitive

    def probe() -> bool:
        lock = make(name)
        if lock.acquire(blocking=False):
            lock.release()
            return False
        return True

    if other is not None:
        return bool(other(probe))
    own = OtherThread()
    try:
        return bool(own(probe))
    finally:
        own.close()
