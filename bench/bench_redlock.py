"""Redlock cycles per second: django-redislock's ``Redlock`` beside pottery's.

Both run on the same three private ``redis-server`` processes (free loopback
ports), in one run, interleaved round by round so that machine noise hits
both alike; the report gives each side's median and the ratio.

A cycle is an uncontended acquire + release of a fresh name, each library
with its defaults (ours keeps its watchdog on). Usage::

    .venv/bin/python bench/bench_redlock.py [--rounds 5] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.servers import RedisServer

ALIASES = ["redlock0", "redlock1", "redlock2"]


def setup_django(urls: list[str]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_redislock"],
        CACHES={
            alias: {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            }
            for alias, url in zip(ALIASES, urls, strict=True)
        },
        REDISLOCK={"REDLOCK": ALIASES},
    )
    django.setup()


def ours() -> Callable[[int], None]:
    from django_redislock import Redlock

    def cycle(i: int) -> None:
        lock = Redlock(f"bench:{i}", timeout=10)
        lock.acquire()
        lock.release()

    return cycle


def pottery_side(urls: list[str]) -> Callable[[int], None]:
    import redis
    from pottery import Redlock as PotteryRedlock

    masters = {redis.Redis.from_url(url) for url in urls}

    def cycle(i: int) -> None:
        lock = PotteryRedlock(key=f"bench:{i}", masters=masters, auto_release_time=10)
        lock.acquire()
        lock.release()

    return cycle


def rate(cycle: Callable[[int], None], seconds: float) -> float:
    for i in range(20):  # warm connections and scripts
        cycle(-i - 1)
    done = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        cycle(done)
        done += 1
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per side")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per side per round")
    options = parser.parse_args()

    servers = [RedisServer().start() for _ in range(3)]
    try:
        urls = [server.url for server in servers]
        setup_django(urls)
        sides = {"django-redislock Redlock": ours(), "pottery Redlock": pottery_side(urls)}
        results: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(options.rounds):
            for name, cycle in sides.items():
                results[name].append(rate(cycle, options.seconds))
        medians = {name: statistics.median(values) for name, values in results.items()}
        print(f"Redlock on 3 redis-servers, {options.rounds} interleaved rounds of "
              f"{options.seconds}s, uncontended acquire+release")  # fmt: skip
        for name, median in medians.items():
            spread = ", ".join(f"{v:.0f}" for v in results[name])
            print(f"  {name:26} median {median:8.0f} cycles/s   (rounds: {spread})")
        ratio = medians["django-redislock Redlock"] / medians["pottery Redlock"]
        print(f"  ratio ours/pottery: {ratio:.2f}x")
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
