"""Semaphore acquire+release cycles per second, against two peers, in one run.

- ``Semaphore``: this library (one EVALSHA to acquire, one to release,
  server-clock leases, fair queue, fencing token, watchdog registration).
- ``seed fair``: the pipeline-based fair semaphore of seed article 001
  (``acquire_fair_semaphore`` / ``release_fair_semaphore``), as written there,
  client clock and all; only ``zadd`` is adapted to redis-py 3's mapping form.
- ``raw floor``: a bare ``ZADD`` then ``ZREM`` (two round trips, no checks):
  the least any correct sorted-set semaphore must pay.

Each contender runs in short blocks, interleaved round-robin (the order
rotating every round) so that noise on a shared machine hits all of them
alike; the report gives the median block rate and the median over rounds of
each contender's rate divided by the floor's in the same round, as
``python -m bench`` does for locks. Starts its own private ``redis-server``.

    .venv/bin/python bench/bench_semaphore.py [--seconds 0.4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# --- the seed's fair semaphore (article 001), as written -----------------------


def acquire_fair_semaphore(conn: Any, semname: str, limit: int, timeout: int = 10) -> Any:
    identifier = str(uuid.uuid4())
    czset = semname + ":owner"
    ctr = semname + ":counter"

    now = time.time()
    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", now - timeout)
    pipeline.zinterstore(czset, {czset: 1, semname: 0})
    pipeline.incr(ctr)
    counter = pipeline.execute()[-1]
    pipeline.zadd(semname, {identifier: now})
    pipeline.zadd(czset, {identifier: counter})
    pipeline.zrank(czset, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier
    pipeline.zrem(semname, identifier)
    pipeline.zrem(czset, identifier)
    pipeline.execute()
    return None


def release_fair_semaphore(conn: Any, semname: str, identifier: str) -> Any:
    pipeline = conn.pipeline(True)
    pipeline.zrem(semname, identifier)
    pipeline.zrem(semname + ":owner", identifier)
    return pipeline.execute()[0]


# --- contenders -----------------------------------------------------------------


def ours(limit: int) -> Callable[[], None]:
    from django_redislock import Semaphore

    sem = Semaphore("bench:ours", limit)

    def cycle() -> None:
        sem.acquire()
        sem.release()

    return cycle


def seed(conn: Any, limit: int) -> Callable[[], None]:
    def cycle() -> None:
        identifier = acquire_fair_semaphore(conn, "bench:seed", limit)
        assert identifier is not None
        release_fair_semaphore(conn, "bench:seed", identifier)

    return cycle


def raw(conn: Any) -> Callable[[], None]:
    def cycle() -> None:
        token = uuid.uuid4().hex
        conn.zadd("bench:raw", {token: time.time()})
        conn.zrem("bench:raw", token)

    return cycle


def rate(cycle: Callable[[], None], seconds: float, server_pid: int | None = None) -> float:
    return block(cycle, seconds, server_pid)[0]


def block(
    cycle: Callable[[], None], seconds: float, server_pid: int | None
) -> tuple[float, float | None]:
    """Cycles per second, and CPU µs per cycle of this process and redis-server
    (``None`` where the server's CPU time cannot be read)."""
    count = 0
    from bench.run import _server_cpu_ns

    server_before = _server_cpu_ns(server_pid)
    cpu_before = time.process_time_ns()
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(50):
            cycle()
        count += 50
        now = time.perf_counter()
        if now >= end:
            break
    cpu = time.process_time_ns() - cpu_before
    server_after = _server_cpu_ns(server_pid)
    if server_before is None or server_after is None:
        return count / (now - start), None
    return count / (now - start), (cpu + server_after - server_before) / count / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.4, help="length of one block")
    parser.add_argument("--rounds", type=int, default=15, help="blocks per contender")
    parser.add_argument("--limit", type=int, default=5, help="semaphore limit")
    options = parser.parse_args()

    from tests.servers import RedisServer

    with RedisServer() as server:
        import django
        from django.conf import settings

        settings.configure(
            CACHES={
                "default": {
                    "BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": server.url,
                    "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
                }
            },
            INSTALLED_APPS=["django_redislock"],
        )
        django.setup()
        conn = server.client()
        server_pid = server.process.pid if server.process is not None else None
        contenders = {
            "Semaphore": ours(options.limit),
            "seed fair": seed(conn, options.limit),
            "raw floor": raw(conn),
        }
        for cycle in contenders.values():  # warm up: connections, script load
            rate(cycle, 0.05)
        names = list(contenders)
        rates: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float | None]] = {name: [] for name in names}
        for round_no in range(options.rounds):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                cycles_per_s, cpu_us = block(contenders[name], options.seconds, server_pid)
                rates[name].append(cycles_per_s)
                cpus[name].append(cpu_us)
        conn.close()

    def same_round(name: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[name], rates[base], strict=True))

    def cpu_ratio(name: str, base: str) -> float | None:
        pairs = [(a, b) for a, b in zip(cpus[name], cpus[base], strict=True) if a and b]
        return statistics.median(b / a for a, b in pairs) if pairs else None

    print(
        f"semaphore acquire+release, 1 client, limit={options.limit}, "
        f"{options.rounds} rounds of interleaved {options.seconds}s blocks "
        f"(median cycles/s; ratio: median of same-round ratios;\n"
        f"CPU: this process + redis-server per cycle, steadier than wall time on a busy machine)"
    )
    for name, samples in rates.items():
        cpu = [c for c in cpus[name] if c]
        ratio = cpu_ratio(name, "raw floor")
        cpu_text = (
            f"   CPU {statistics.median(cpu):6.1f} us  {ratio:5.2f}x floor" if cpu and ratio else ""
        )
        print(
            f"  {name:<10} {statistics.median(samples):>9.0f} /s   "
            f"{same_round(name, 'raw floor'):5.2f}x floor   "
            f"(min {min(samples):.0f}, max {max(samples):.0f}){cpu_text}"
        )
    print(f"  Semaphore vs seed fair: {same_round('Semaphore', 'seed fair'):.2f}x")


if __name__ == "__main__":
    main()
