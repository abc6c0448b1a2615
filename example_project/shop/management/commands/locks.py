"""``manage.py locks`` that first says which Redis it looks at.

Without ``REDIS_URL`` the shop's Redis is an embedded fakeredis server inside
the running shop: this command finds it (``embedded_redis``); with no shop
running it can only start an empty one of its own, and says so plainly
rather than answer "Nothing is held." as if that were the shop's state.
"""

from __future__ import annotations

import os
from typing import Any

from django_redislock.management.commands import locks
from example_project import embedded_redis


class Command(locks.Command):
    def handle(self, *args: Any, **options: Any) -> None:
        if not os.environ.get("REDIS_URL"):
            private = embedded_redis.started_here()
            self.stderr.write(
                embedded_redis.describe(),
                style_func=self.style.WARNING if private else self.style.NOTICE,
            )
        super().handle(*args, **options)
