"""Redlock's code loads only with Redlock: a plain ``Lock`` never pays for its
quorum code or its per-server thread pools."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import django_redislock
from django_redislock import Lock, AsyncLock, Semaphore, ReadWriteLock, MultiLock, require_lock
import django_redislock.admin, django_redislock.models, django_redislock.testing
loaded = sorted(m for m in sys.modules if m.startswith("django_redislock.primitives.redlock"))
assert not loaded, loaded
from django_redislock import Redlock
assert Redlock.__module__ == "django_redislock.primitives.redlock.lock", Redlock.__module__
"""


def test_importing_the_package_and_every_other_primitive_loads_no_redlock_module() -> None:
    env_setup = "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.settings')\n"
    django_setup = "import django; django.setup()\n"
    result = subprocess.run(
        [sys.executable, "-c", env_setup + django_setup + CHECK],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
