"""``manage.py locks`` over 100,000 held locks: fast, and never blocking Redis.

Timing on a shared CI box is noisy, so the test asserts the *shape* of the
traffic (few commands, each bounded: SCAN with a COUNT, scripts over at most
``SCRIPT_BATCH`` keys, average server time per call far under a millisecond)
and a generous wall-clock bound; ``bench/bench_ops.py`` prints the real numbers.
"""

from __future__ import annotations

import io
import json
import math
import time

import pytest
import redis
from django.core.management import call_command

from django_redislock.ops.inspection import SCRIPT_BATCH
from tests.support import lockfill

LOCKS = 100_000


@pytest.mark.slow
def test_list_json_over_100k_locks(redis_client: redis.Redis, real_redis: None) -> None:
    lockfill.fill(redis_client, LOCKS)
    redis_client.config_resetstat()
    out = io.StringIO()
    started = time.monotonic()
    call_command("locks", "list", "--json", stdout=out)
    took = time.monotonic() - started
    data = json.loads(out.getvalue())
    assert len(data) == LOCKS
    assert data[0]["name"] == "bulk:000000"
    assert data[-1]["name"] == f"bulk:{LOCKS - 1:06d}"
    assert took < 60, f"locks list --json took {took:.1f}s"

    stats = redis_client.info("commandstats")
    assert "cmdstat_keys" not in stats
    scripts = stats["cmdstat_evalsha"]["calls"]
    assert scripts == math.ceil(LOCKS / SCRIPT_BATCH)
    assert stats["cmdstat_scan"]["calls"] < LOCKS / 100  # SCAN ... COUNT 1000
    # server time per call: a few hundred µs at most, so nothing blocks Redis
    for command in ("cmdstat_evalsha", "cmdstat_scan"):
        assert stats[command]["usec_per_call"] < 2000, stats[command]
    # no per-name commands from the client: GET and PTTL run inside the scripts
    inside = {"cmdstat_get", "cmdstat_pttl"}
    assert sum(s["calls"] for c, s in stats.items() if c not in inside) < LOCKS / 20
