"""Soak: nothing is left behind after many acquire/release cycles.

    python bench/soak.py [--cycles 100000] [--redis-url URL] [--async] [--tracemalloc]

Runs ``cycles`` acquire/release cycles, each on a new name, with the default
settings (auto-renew on, so the watchdog thread is used), then checks that

- the Redis key count returns to where it started: the only keys a released
  lock leaves are its fencing counters, which expire 10 s after creation;
  the wait is a bounded poll of DBSIZE, and its length is reported;
- the process's thread count returns to where it started (the watchdog thread
  exits once idle);
- memory is flat: live Python objects (``gc``), RSS and, with
  ``--tracemalloc`` (which makes the run several times slower), traced Python
  allocations, after the run against a baseline taken after a warm-up.

Without ``--redis-url`` it starts a private ``redis-server`` on a free loopback
port (never 6379). Exits 1 if something was left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: How long to wait for Redis to expire the fencing counters (they live 10 s).
KEY_WAIT = 60.0
#: How long to wait for the watchdog thread to exit (it idles 5 s).
THREAD_WAIT = 15.0
#: Allowed growth of traced Python memory over the whole run.
MEMORY_SLACK = 256 * 1024
#: Allowed growth of the number of live Python objects over the whole run.
OBJECT_SLACK = 1000


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def setup_django(url: str) -> None:
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_redislock"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            }
        },
        USE_TZ=True,
        # Counters kept 10 s after a name's last use (the default is an hour), so
        # the run can show that they, too, leave nothing behind.
        REDISLOCK={"STATS": 10},
    )
    import django

    django.setup()


def sync_cycles(start: int, count: int) -> None:
    from django_redislock import Lock

    for i in range(start, start + count):
        lock = Lock(f"soak:{i}")
        if not lock.acquire(blocking=False):
            raise SystemExit(f"soak:{i} was not free")
        lock.release()


def async_cycles(start: int, count: int) -> None:
    from django_redislock import AsyncLock

    async def run() -> None:
        for i in range(start, start + count):
            lock = AsyncLock(f"soak:a:{i}")
            if not await lock.acquire(blocking=False):
                raise SystemExit(f"soak:a:{i} was not free")
            await lock.release()

    asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100_000, help="acquire/release cycles")
    parser.add_argument("--redis-url", help="use this server (it is not flushed)")
    parser.add_argument("--async", dest="use_async", action="store_true", help="use AsyncLock")
    parser.add_argument(
        "--tracemalloc", action="store_true", help="also trace Python allocations (slower)"
    )
    options = parser.parse_args()

    server = None
    url = options.redis_url
    if url is None:
        from tests.support.servers import RedisServer

        server = RedisServer().start()
        url = server.url
    try:
        return soak(url, options.cycles, options.use_async, options.tracemalloc)
    finally:
        if server is not None:
            server.stop()


def traced() -> int:
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


def soak(url: str, cycles: int, use_async: bool, trace: bool) -> int:
    import redis

    setup_django(url)
    run = async_cycles if use_async else sync_cycles
    client = redis.Redis.from_url(url)
    keys_before = client.dbsize()
    connections_before = client.info("clients")["connected_clients"]
    threads_before = threading.active_count()
    print(f"soak: {cycles:,} {'AsyncLock' if use_async else 'Lock'} cycles against {url}")
    print(f"  start: {keys_before} keys, {threads_before} threads")

    warmup = min(1000, cycles)
    run(0, warmup)  # clients, scripts, signal receivers: allocated once
    gc.collect()
    if trace:
        tracemalloc.start()
    traced_base = traced()
    objects_base = len(gc.get_objects())
    rss_base = rss_bytes()

    began = time.perf_counter()
    done = warmup
    step = max(1, (cycles - warmup) // 4)
    while done < cycles:
        batch = min(step, cycles - done)
        run(done, batch)
        done += batch
        gc.collect()
        print(
            f"  {done:>7,} cycles  {client.dbsize():>7,} keys  "
            f"objects {len(gc.get_objects()) - objects_base:+6}  "
            f"traced {(traced() - traced_base) / 1024:+8.1f} KiB  "
            f"RSS {(rss_bytes() - rss_base) / 1024:+8.0f} KiB"
        )
    elapsed = time.perf_counter() - began
    print(f"  {cycles - warmup:,} cycles in {elapsed:.1f} s ({(cycles - warmup) / elapsed:,.0f}/s)")

    gc.collect()
    traced_growth = traced() - traced_base
    object_growth = len(gc.get_objects()) - objects_base
    rss_growth = rss_bytes() - rss_base
    tracemalloc.stop()

    waited_from = time.monotonic()
    keys_after = client.dbsize()
    while keys_after > keys_before and time.monotonic() - waited_from < KEY_WAIT:
        time.sleep(0.5)
        keys_after = client.dbsize()
    key_wait = time.monotonic() - waited_from

    waited_from = time.monotonic()
    deadline = waited_from + THREAD_WAIT
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    thread_wait = time.monotonic() - waited_from
    threads_after = threading.active_count()
    # the library's own pooled connection (one, reused) is expected to stay open
    connections_after = client.info("clients")["connected_clients"]
    client.close()

    print(f"  keys:    {keys_before} -> {keys_after} (counters expired after {key_wait:.1f} s)")
    print(f"  Redis connections: {connections_before} -> {connections_after} (pool keeps 1)")
    print(
        f"  threads: {threads_before} -> {threads_after} "
        f"(watchdog exited after {thread_wait:.1f} s)"
    )
    print(
        f"  memory:  objects {object_growth:+}, RSS {rss_growth / 1024:+.0f} KiB"
        + (f", traced {traced_growth / 1024:+.1f} KiB" if trace else "")
        + f" over {cycles - warmup:,} cycles after warm-up"
    )
    problems = []
    if keys_after != keys_before:
        problems.append(f"{keys_after - keys_before} keys left in Redis")
    if connections_after > connections_before + 1:
        problems.append(f"{connections_after - connections_before} Redis connections open")
    if threads_after != threads_before:
        problems.append(f"{threads_after - threads_before} threads left running")
    if object_growth > OBJECT_SLACK:
        problems.append(f"{object_growth} more live Python objects")
    if traced_growth > MEMORY_SLACK:
        problems.append(f"Python memory grew by {traced_growth / 1024:.0f} KiB")
    print("  LEFT BEHIND: " + "; ".join(problems) if problems else "  nothing left behind")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
