"""Semaphore acquire+release cycles per second, against two peers, in one run.

- ``Semaphore``: this library (one EVALSHA to acquire, one to release,
  server-clock leases, fair queue, fencing token on use, watchdog registration),
  one object reused for every cycle;
- ``Sem/use``: the same with a new ``Semaphore`` per cycle, as a view writes
  ``with Semaphore("exports", 5, timeout=30, blocking_timeout=5):``;
- ``seed fair``: the pipeline-based fair semaphore of seed article 001
  (``acquire_fair_semaphore`` / ``release_fair_semaphore``), as written there,
  client clock and all; only ``zadd`` is adapted to redis-py 3's mapping form.
- ``least leased`` (the floor): the least correct leased semaphore, one
  script (``TIME``, ``ZREMRANGEBYSCORE`` of the expired, ``ZCARD``, ``ZADD``
  with the lease end as score) to acquire and a bare ``ZREM`` to release: no
  queue, no fencing token, no fairness; what any semaphore that checks its
  limit and frees a dead holder's permit must pay;
- ``raw ZADD/ZREM``: a bare ``ZADD`` then ``ZREM`` (two round trips, no
  limit checked at all), for reference.

Each contender runs in short blocks, interleaved round-robin (the order
rotating every round) so that noise on a shared machine hits all of them
alike; the report gives the median block rate and the median over rounds of
each contender's rate divided by the floor's in the same round, as
``python -m bench`` does for locks, and the server's own time per cycle from
``INFO commandstats`` (reset before every block; see ``bench/redistime.py``)
with its ratio to the floor's. Starts its own private ``redis-server``.

    .venv/bin/python bench/bench_semaphore.py [--seconds 0.4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redistime import RedisTime, measured, ratios
from bench.uncontended import rotated, server_cpu_ns

FLOOR = "least leased"

#: The least correct leased semaphore's acquire: expired permits dropped, the
#: limit checked, the permit added with its lease end (server ms) as score.
#: KEYS[1] holders; ARGV[1] limit, ARGV[2] lease_ms, ARGV[3] token.
LEAST_LEASED_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
"""


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


def ours_per_use(limit: int) -> Callable[[], None]:
    from django_redislock import Semaphore

    def cycle() -> None:
        with Semaphore("bench:ours-per-use", limit, timeout=30, blocking_timeout=5):
            pass

    return cycle


def seed(conn: Any, limit: int) -> Callable[[], None]:
    def cycle() -> None:
        identifier = acquire_fair_semaphore(conn, "bench:seed", limit)
        assert identifier is not None
        release_fair_semaphore(conn, "bench:seed", identifier)

    return cycle


def least_leased(conn: Any, limit: int) -> Callable[[], None]:
    acquire = conn.register_script(LEAST_LEASED_ACQUIRE)

    def cycle() -> None:
        token = uuid.uuid4().hex
        assert acquire(keys=["bench:leased"], args=[limit, 30_000, token]) == 1
        conn.zrem("bench:leased", token)

    return cycle


def raw(conn: Any) -> Callable[[], None]:
    def cycle() -> None:
        token = uuid.uuid4().hex
        conn.zadd("bench:raw", {token: time.time()})
        conn.zrem("bench:raw", token)

    return cycle


def block(
    cycle: Callable[[], None], seconds: float, server_pid: int | None
) -> tuple[tuple[float, float | None], int]:
    """``((cycles per second, CPU µs per cycle), cycles)``: CPU is this process and
    redis-server, ``None`` where the server's CPU time cannot be read."""
    count = 0
    server_before = server_cpu_ns(server_pid)
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
    server_after = server_cpu_ns(server_pid)
    if server_before is None or server_after is None:
        return (count / (now - start), None), count
    return (count / (now - start), (cpu + server_after - server_before) / count / 1000), count


def configure(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            }
        },
        INSTALLED_APPS=["django_redislock"],
    )
    django.setup()


@dataclass
class Samples:
    rates: list[float] = field(default_factory=list)
    cpus: list[float | None] = field(default_factory=list)
    redis: RedisTime = field(default_factory=RedisTime)


def measure(options: argparse.Namespace) -> dict[str, Samples]:
    """Interleaved blocks of every contender on a private redis-server."""
    from tests.support.servers import RedisServer

    with RedisServer() as server:
        configure(server.url)
        conn = server.client()
        server_pid = server.process.pid if server.process is not None else None
        contenders = {
            "Semaphore": ours(options.limit),
            "Sem/use": ours_per_use(options.limit),
            "seed fair": seed(conn, options.limit),
            FLOOR: least_leased(conn, options.limit),
            "raw ZADD/ZREM": raw(conn),
        }
        for cycle in contenders.values():  # warm up: connections, script load
            block(cycle, 0.05, None)
        names = list(contenders)
        samples = {name: Samples() for name in names}
        for round_no in range(options.rounds):
            for name in rotated(names, round_no):
                run = functools.partial(block, contenders[name], options.seconds, server_pid)
                cycles_per_s, cpu_us = measured(conn, samples[name].redis, run)
                samples[name].rates.append(cycles_per_s)
                samples[name].cpus.append(cpu_us)
        conn.close()
    return samples


def report(options: argparse.Namespace, samples: dict[str, Samples]) -> None:
    rates = {name: sample.rates for name, sample in samples.items()}
    cpus = {name: sample.cpus for name, sample in samples.items()}

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
    for name, samples_ in rates.items():
        cpu = [c for c in cpus[name] if c]
        ratio = cpu_ratio(name, FLOOR)
        cpu_text = (
            f"   CPU {statistics.median(cpu):6.1f} us  {ratio:5.2f}x floor" if cpu and ratio else ""
        )
        print(
            f"  {name:<13} {statistics.median(samples_):>9.0f} /s   "
            f"{same_round(name, FLOOR):5.2f}x floor   "
            f"(min {min(samples_):.0f}, max {max(samples_):.0f}){cpu_text}"
        )
    print(f"  Semaphore vs seed fair: {same_round('Semaphore', 'seed fair'):.2f}x")
    times = {name: sample.redis.per_cycle() for name, sample in samples.items()}
    ratios(times, FLOOR)
    print(
        "Redis time per cycle (INFO commandstats usec / cycles; top = commands the client "
        "sent,\nall = every command the server ran, scripts' inner calls counted again)"
    )
    for name, row in times.items():
        print(
            f"  {name:<13} Redis top {row['redis_us_top']:6.1f} us {row['redis_top_x_raw']:5.2f}x "
            f"floor   all {row['redis_us_all']:6.1f} us {row['redis_all_x_raw']:5.2f}x floor"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.4, help="length of one block")
    parser.add_argument("--rounds", type=int, default=15, help="blocks per contender")
    parser.add_argument("--limit", type=int, default=5, help="semaphore limit")
    options = parser.parse_args()
    report(options, measure(options))


if __name__ == "__main__":
    main()
