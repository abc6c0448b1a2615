"""A deliberately naive Redis lock, reproducing the mistakes of the seed articles.

Nothing here is library code: it exists so that
``tests/faults/test_naive_lock_failures.py`` can show each failure mode
happening to a naive lock and not to ``Lock``. The flags
switch one mistake on at a time:

- ``atomic=False``: ``SETNX`` then ``EXPIRE``, two commands; a crash between
  them leaves a lock with no lease, held for ever.
- ``safe_release=False``: release is an unconditional ``DEL``; a holder whose
  lease ran out deletes the lock that now belongs to someone else.
- no renewal at all: the lease is fixed, so a task longer than the lease
  overlaps with the next holder.

Waiting is the usual sleep-and-retry loop.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import redis

#: Compare-and-delete, the textbook safe release (used when ``safe_release``).
_SAFE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class NaiveLock:
    def __init__(
        self,
        client: redis.Redis,
        name: str,
        *,
        lease: float,
        atomic: bool = True,
        safe_release: bool = False,
        poll: float = 0.01,
    ) -> None:
        self.client = client
        self.key = f"naive:{name}"
        self.lease = lease
        self.atomic = atomic
        self.safe_release = safe_release
        self.poll = poll
        self.token = secrets.token_hex(8)

    def try_acquire(self, between: Callable[[], None] | None = None) -> bool:
        lease_ms = int(self.lease * 1000)
        if self.atomic:
            return bool(self.client.set(self.key, self.token, nx=True, px=lease_ms))
        if not self.client.setnx(self.key, self.token):
            return False
        if between is not None:
            between()  # the crash window: the key exists with no TTL
        self.client.pexpire(self.key, lease_ms)
        return True

    def acquire(self, timeout: float, between: Callable[[], None] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.try_acquire(between):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll)

    def release(self) -> None:
        if self.safe_release:
            self.client.eval(_SAFE_RELEASE, 1, self.key, self.token)
        else:
            self.client.delete(self.key)
