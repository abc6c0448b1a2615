"""Operations at scale: ``manage.py locks`` over 100,000 held locks.

    .venv/bin/python bench/bench_ops.py [--locks 100000]

Starts a private redis-server, writes the locks with a pipeline (the lock
value format of ``backend/scripts/_lock_value.lua``), then times ``locks list --json``
and ``locks clear --all`` and reads SLOWLOG (threshold 1 ms) to show that no
single command they sent blocked the server. Also measures what the usage
counters (``REDISLOCK['STATS']``) cost on uncontended acquire/release cycles.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def slowest(client: object, since: float) -> tuple[int, int, str]:
    entries = [e for e in client.slowlog_get(1024) if e["start_time"] >= since]  # type: ignore[attr-defined]
    if not entries:
        return 0, 0, "-"
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    command = command.decode() if isinstance(command, bytes) else str(command)
    return len(entries), worst["duration"], command[:60]


def cycles_per_second(client: Any, seconds: float, stats: bool) -> tuple[float, float]:
    """Uncontended acquire+release cycles per second, and the server's µs per script call."""
    from django.test import override_settings

    from django_redislock import Lock

    lock = Lock("bench:cycle", auto_renew=False)
    with override_settings(REDISLOCK={"STATS": stats}):
        lock.acquire()
        lock.release()
        client.config_resetstat()
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            lock.acquire()
            lock.release()
            count += 1
    usec = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    return count / seconds, float(usec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=100_000, help="How many held locks.")
    parser.add_argument("--seconds", type=float, default=1.0, help="Per cycles/s measurement.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating off/on rounds.")
    options = parser.parse_args()

    from tests.support.servers import RedisServer

    server = None
    url = os.environ.get("REDIS_URL")
    if not url:
        server = RedisServer().start()
        url = server.url
    os.environ["REDISLOCK_TEST_REDIS_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import redis
    from django.core.management import call_command

    from tests.support import lockfill

    client = redis.Redis.from_url(url)
    try:
        client.flushall()
        print(f"redis-server {client.info('server')['redis_version']} at {url}")
        started = time.perf_counter()
        lockfill.fill(client, options.locks)
        print(f"fill {options.locks} locks: {time.perf_counter() - started:.2f}s")

        client.config_set("slowlog-log-slower-than", 1000)  # µs
        client.slowlog_reset()
        since = time.time() - 1
        out = io.StringIO()
        started = time.perf_counter()
        call_command("locks", "list", "--json", stdout=out)
        took = time.perf_counter() - started
        print(
            f"locks list --json: {took:.2f}s for {options.locks} locks "
            f"({len(out.getvalue()) / 1e6:.1f} MB of JSON)"
        )
        n, worst, command = slowest(client, since)
        print(f"  commands slower than 1 ms: {n}; slowest {worst} µs ({command})")

        client.slowlog_reset()
        since = time.time() - 1
        started = time.perf_counter()
        call_command(
            "locks", "clear", "--all", "--noinput", stdout=io.StringIO(), stderr=io.StringIO()
        )
        took = time.perf_counter() - started
        print(f"locks clear --all: {took:.2f}s; keys left: {client.dbsize()}")
        n, worst, command = slowest(client, since)
        print(f"  commands slower than 1 ms: {n}; slowest {worst} µs ({command})")

        # alternate short runs so load drifting on a shared box hits both alike
        offs, ons = [], []
        for _ in range(options.rounds):
            offs.append(cycles_per_second(client, options.seconds, stats=False))
            ons.append(cycles_per_second(client, options.seconds, stats=True))
        off = statistics.median(r for r, _ in offs)
        on = statistics.median(r for r, _ in ons)
        off_us = statistics.median(u for _, u in offs)
        on_us = statistics.median(u for _, u in ons)
        print(
            f"uncontended acquire+release (median of {options.rounds}): {off:.0f}/s counters "
            f"off, {on:.0f}/s counters on (ratio on/off {on / off:.3f})"
        )
        print(
            f"  server time per script call (acquire and release averaged): "
            f"{off_us:.2f} µs off, {on_us:.2f} µs on"
        )
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
