"""How many auto-renewed leases one process keeps alive: the watchdog's capacity.

For each count N, one process acquires N ``Lock``s of a short lease (1 s by
default: each is renewed every third of a second), holds them all for
``--hold`` seconds with ``auto_renew`` on, then releases them. A lease that
lapsed is one ``lock_lost`` reported, or one whose release raised
``LockLostError``; both are counted once per name. Also reported: the
renewals the server ran per second while the locks were held (``EVALSHA``
calls of the extend script, from ``INFO commandstats``) against the
``3 N / lease`` the watchdog owes them, and the round trips it took
(``Pipeline.execute`` and ``Redis.execute_command`` calls from the
watchdog's threads, counted client-side as a tracer would see them).

Starts a private ``redis-server`` on a free loopback port (never 6379).

    python -m bench.renewal_capacity [--counts 250 500 1000 2000 4000] [--lease 1] [--hold 6]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.workers import setup_django

#: The watchdog's threads: its scheduler and its lanes.
WATCHDOG_THREADS = ("django-redislock-watchdog", "django-redislock-renewal")


@contextmanager
def count_round_trips() -> Iterator[collections.Counter[str]]:
    """Count the round trips the watchdog's threads make while the block runs:
    ``pipeline`` per ``Pipeline.execute``, ``command`` per ``Redis.execute_command``
    (what tracers wrap), and ``piped`` per command a pipeline carried."""
    import redis
    from redis.client import Pipeline

    counts: collections.Counter[str] = collections.Counter()
    execute_command, execute = redis.Redis.execute_command, Pipeline.execute

    def counted_command(self: Any, *args: Any, **options: Any) -> Any:
        if threading.current_thread().name in WATCHDOG_THREADS:
            counts["command"] += 1
        return execute_command(self, *args, **options)

    def counted_execute(self: Any, *args: Any, **options: Any) -> Any:
        if threading.current_thread().name in WATCHDOG_THREADS:
            counts["pipeline"] += 1
            counts["piped"] += len(self.command_stack)
        return execute(self, *args, **options)

    redis.Redis.execute_command = counted_command  # type: ignore[method-assign]
    Pipeline.execute = counted_execute  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
        Pipeline.execute = execute  # type: ignore[method-assign]


def evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def measure(client: Any, count: int, lease: float, hold: float) -> dict[str, Any]:
    """Hold ``count`` leases of ``lease`` seconds for ``hold`` seconds; what lapsed."""
    from django_redislock import Lock, LockLostError
    from django_redislock import signals as lock_signals
    from django_redislock.holds.watchdog import watchdog

    prefix = f"bench:renewal:{count}:{time.monotonic_ns()}"
    lost: set[str] = set()

    def on_lost(name: str, **kwargs: Any) -> None:
        if name.startswith(prefix):
            lost.add(name)

    lock_signals.lock_lost.connect(on_lost)
    try:
        locks = [Lock(f"{prefix}:{i}", timeout=lease) for i in range(count)]
        began = time.monotonic()
        for lock in locks:
            lock.acquire()
        acquiring = time.monotonic() - began
        with count_round_trips() as trips:
            before = evalsha_calls(client)
            time.sleep(hold)
            renewed = evalsha_calls(client) - before
        for lock in locks:
            try:
                lock.release()
            except LockLostError:
                lost.add(lock.name)
    finally:
        lock_signals.lock_lost.disconnect(on_lost)
    owed = 3 * count / lease
    return {
        "count": count,
        "lost": len(lost),
        "acquire_s": round(acquiring, 2),
        "renewals_per_s": round(renewed / hold),
        "owed_per_s": round(owed),
        "round_trips_per_s": round((trips["pipeline"] + trips["command"]) / hold),
        "per_pipeline": round(trips["piped"] / trips["pipeline"], 1) if trips["pipeline"] else 0,
        "watching_after": watchdog.watching(),
    }


def render(rows: list[dict[str, Any]], server: str, lease: float, hold: float) -> str:
    lines = [
        f"Renewal capacity, {server}: N locks of a {lease:g} s lease held {hold:g} s "
        f"in one process",
        f"{'N':>6} {'lost':>6} {'renewed/s':>10} {'owed/s':>8} {'trips/s':>8} "
        f"{'per pipe':>9} {'acquire s':>10}",
    ]
    for row in rows:
        lines.append(
            f"{row['count']:>6} {row['lost']:>6} {row['renewals_per_s']:>10} "
            f"{row['owed_per_s']:>8} {row['round_trips_per_s']:>8} "
            f"{row['per_pipeline']:>9} {row['acquire_s']:>10}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--counts", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000],
        help="how many locks to hold, one run each",
    )  # fmt: skip
    parser.add_argument("--lease", type=float, default=1.0, help="each lock's lease (s)")
    parser.add_argument("--hold", type=float, default=6.0, help="how long they are held (s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer, server_name

    # Each lapsed lease is a WARNING; a lapsed run would print thousands of them.
    logging.getLogger("django_redislock").setLevel(logging.ERROR)

    with RedisServer() as server:
        setup_django(server.url)
        from django_redis import get_redis_connection

        client = get_redis_connection("default")
        rows = [measure(client, count, args.lease, args.hold) for count in args.counts]
        name = server_name(client)
    if args.json:
        json.dump({"server": name, "lease": args.lease, "hold": args.hold, "rows": rows},
                  sys.stdout, indent=2)  # fmt: skip
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(rows, name, args.lease, args.hold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
