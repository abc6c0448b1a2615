"""How many auto-renewed leases one process keeps alive: the watchdog's capacity.

For each count N, one process acquires N ``Lock``s of a short lease with
``auto_renew`` on (timing the acquires), holds them all for ``--hold``
seconds, then releases them. Reported per run:

- leases lost: one ``lock_lost`` reported, or one whose release raised
  ``LockLostError``; counted once per name;
- the acquire rate while taking them (the watchdog renews the ones already
  held meanwhile);
- renewals sent a second while only holding (keys of the watchdog's script
  calls, counted client-side on ``Redis.execute_command`` as a tracer sees
  them) against the ``3 N / lease`` owed, and the calls they took;
- the watchdog's CPU while only holding, as a share of one core (the CPU
  clocks of its threads: scheduler and lanes) and per renewal, and the
  whole process's;
- Redis time per renewal (``INFO commandstats``: ``EVALSHA`` microseconds
  over the renewals);
- the lag warning (``signals.renewal_lag``) and the first loss, seconds after
  the first acquire: a process pushed past its capacity must warn first;
- how many WARNING lines the losses took in the log.

Two peers are measured in the same run: the floor of renewing a lease (the
same N keys given a new TTL by bare ``PEXPIRE``s pipelined 256 at a time
from one thread, no owner check: ``floor_us``, Python per key;
``watchdog_vs_floor`` compares the watchdog's CPU per renewal with it), and
the way the watchdog renewed before, one ``EVALSHA`` of the extend script
per held lease pipelined 256 at a time (``one_call_each_us`` and
``one_call_each_redis_us``: Python and Redis per renewal, without the old
scheduler's own cost).

Starts a private ``redis-server`` on a free loopback port (never 6379).

    python -m bench.renewal_capacity [--counts 20000] [--lease 3] [--hold 10]
    python -m bench.renewal_capacity --counts 100000 --lease 1 --hold 5   # past capacity
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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
#: The issue's targets for 20,000 locks of 3 s held 10 s.
TARGET_ACQUIRE_RATE = 1500.0
TARGET_CPU_SHARE = 0.30


@contextmanager
def count_calls() -> Iterator[collections.Counter[str]]:
    """Count what the watchdog's threads send while the block runs: ``calls``
    per ``Redis.execute_command`` (what tracers wrap) and ``renewals``, the
    keys of their ``EVALSHA``s."""
    import redis

    counts: collections.Counter[str] = collections.Counter()
    execute_command = redis.Redis.execute_command

    def counted(self: Any, *args: Any, **options: Any) -> Any:
        if threading.current_thread().name in WATCHDOG_THREADS:
            counts["calls"] += 1
            if str(args[0]).upper() == "EVALSHA":
                counts["renewals"] += int(args[2])
        return execute_command(self, *args, **options)

    redis.Redis.execute_command = counted  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        redis.Redis.execute_command = execute_command  # type: ignore[method-assign]


def watchdog_cpu() -> dict[int, float]:
    """CPU seconds each of the watchdog's live threads has used so far."""
    used = {}
    for thread in threading.enumerate():
        if thread.name in WATCHDOG_THREADS and thread.ident is not None:
            with contextlib.suppress(OSError, AttributeError):  # gone meanwhile; not Linux
                used[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return used


def cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the watchdog's threads used since ``before``: those alive
    now (a lane that went idle and exited meanwhile is left out)."""
    return sum(cpu - before.get(ident, 0.0) for ident, cpu in watchdog_cpu().items())


def evalsha_stats(client: Any) -> tuple[int, float]:
    """``EVALSHA`` calls and microseconds the server has counted."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), float(stats.get("usec", 0))


class Timeline:
    """When the first lag warning and the first loss came; the loss lines logged."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.start = time.monotonic()
        self.lost: set[str] = set()
        self.first_loss: float | None = None
        self.first_reason = ""
        self.warned: float | None = None
        self.loss_lines = 0

    def on_lost(self, name: str, reason: str = "", **kwargs: Any) -> None:
        if name.startswith(self.prefix):
            self.lost.add(name)
            if self.first_loss is None:
                self.first_loss = time.monotonic() - self.start
                self.first_reason = reason

    def on_lag(self, lagging: bool, **kwargs: Any) -> None:
        if lagging and self.warned is None:
            self.warned = time.monotonic() - self.start


class _LossLines(logging.Handler):
    def __init__(self, timeline: Timeline) -> None:
        super().__init__(logging.WARNING)
        self.timeline = timeline

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Lost the lease"):
            self.timeline.loss_lines += 1


def floor_us(client: Any, keys: list[str], lease_ms: int) -> float:
    """Python per key of renewing ``keys`` by bare pipelined ``PEXPIRE``s."""
    began = time.thread_time()
    for start in range(0, len(keys), 256):
        with client.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 256]:
                pipe.pexpire(key, lease_ms)
            pipe.execute()
    return (time.thread_time() - began) / len(keys) * 1e6


def one_call_each(
    client: Any, locks: list[Any], lease: float, batch_redis_us: float
) -> tuple[float, float]:
    """How the watchdog renewed before: one ``EVALSHA`` of the extend script
    per lease, pipelined 256 at a time. Python and Redis microseconds per
    renewal of ``locks`` (held); the Redis time of the watchdog's own calls
    meanwhile (``batch_redis_us`` a renewal) is taken out."""
    from django_redislock.backend.scripts import LOCK_EXTEND

    LOCK_EXTEND.ensure_loaded(client)
    holdings = [holding for holding in (lock._holding() for lock in locks) if holding is not None]
    usec = evalsha_stats(client)[1]
    with count_calls() as watchdog_sent:
        began = time.thread_time()
        for start in range(0, len(holdings), 256):
            with client.pipeline(transaction=False) as pipe:
                for holding in holdings[start : start + 256]:
                    LOCK_EXTEND.queue(pipe, *holding.renew_call(lease))
                pipe.execute()
        python = (time.thread_time() - began) / len(holdings) * 1e6
        redis_usec = evalsha_stats(client)[1] - usec
    redis_usec -= watchdog_sent["renewals"] * batch_redis_us
    return python, max(redis_usec, 0.0) / len(holdings)


def measure(client: Any, count: int, lease: float, hold: float) -> dict[str, Any]:
    """Hold ``count`` leases of ``lease`` seconds for ``hold`` seconds; what lapsed."""
    from django_redislock import Lock, LockLostError
    from django_redislock import signals as lock_signals
    from django_redislock.holds.watchdog import watchdog

    prefix = f"bench:renewal:{count}:{time.monotonic_ns()}"
    timeline = Timeline(prefix)
    lines = _LossLines(timeline)
    logging.getLogger("django_redislock").addHandler(lines)
    lock_signals.lock_lost.connect(timeline.on_lost)
    lock_signals.renewal_lag.connect(timeline.on_lag)
    try:
        locks: list[Any] = []
        timeline.start = began = time.monotonic()
        for i in range(count):  # each made as it is needed, as an application does
            lock = Lock(f"{prefix}:{i}", timeout=lease)
            lock.acquire()
            locks.append(lock)
        acquiring = time.monotonic() - began
        with count_calls() as sent:
            calls, usec = evalsha_stats(client)
            threads, process = watchdog_cpu(), time.process_time()
            time.sleep(hold)
            cpu, process = cpu_since(threads), time.process_time() - process
            calls, usec = (a - b for a, b in zip(evalsha_stats(client), (calls, usec), strict=True))
        batch_redis_us = usec / sent["renewals"] if sent["renewals"] else 0.0
        each_us, each_redis_us = one_call_each(client, locks, lease, batch_redis_us)
        for lock in locks:
            try:
                lock.release()
            except LockLostError:
                timeline.lost.add(lock.name)
        watchdog.losses.flush(force=True)
        keys = [f"bench:floor:{i}" for i in range(count)]
        client.mset(dict.fromkeys(keys, "x"))
        floor = floor_us(client, keys, int(lease * 1000))
        client.delete(*keys)
    finally:
        lock_signals.lock_lost.disconnect(timeline.on_lost)
        lock_signals.renewal_lag.disconnect(timeline.on_lag)
        logging.getLogger("django_redislock").removeHandler(lines)
    renewals = sent["renewals"]
    per_renewal_us = cpu / renewals * 1e6 if renewals else 0.0
    return {
        "count": count,
        "lost": len(timeline.lost),
        "acquire_per_s": round(count / acquiring),
        "renewals_per_s": round(renewals / hold),
        "owed_per_s": round(3 * count / lease),
        "calls_per_s": round(sent["calls"] / hold),
        "watchdog_cpu": round(cpu / hold, 3),
        "process_cpu": round(process / hold, 3),
        "watchdog_us_per_renewal": round(per_renewal_us, 2),
        "redis_us_per_renewal": round(usec / renewals, 2) if renewals else 0.0,
        "floor_us": round(floor, 2),
        "watchdog_vs_floor": round(per_renewal_us / floor, 2) if floor else 0.0,
        "one_call_each_us": round(each_us, 2),
        "one_call_each_redis_us": round(each_redis_us, 2),
        "lag_warning_s": None if timeline.warned is None else round(timeline.warned, 2),
        "first_loss_s": None if timeline.first_loss is None else round(timeline.first_loss, 2),
        "first_loss_reason": timeline.first_reason,
        "loss_log_lines": timeline.loss_lines,
        "watching_after": watchdog.watching(),
    }


def verdicts(row: dict[str, Any], lease: float) -> list[str]:
    """The issue's targets this row speaks to, each with its outcome."""
    out = []
    if row["count"] == 20000 and lease == 3:
        out.append(f"loses none: {'yes' if row['lost'] == 0 else 'NO'}")
        rate = row["acquire_per_s"]
        out.append(f"acquires >= {TARGET_ACQUIRE_RATE:,.0f}/s: {'yes' if rate >= 1500 else 'NO'}")
        share = row["watchdog_cpu"]
        out.append(f"watchdog <= 30% of a core: {'yes' if share <= TARGET_CPU_SHARE else 'NO'}")
    if row["first_loss_s"] is not None:
        warned = row["lag_warning_s"]
        first = warned is not None and warned < row["first_loss_s"]
        out.append(f"lag warning before the first loss: {'yes' if first else 'NO'}")
        out.append(f"first loss: {row['first_loss_reason']}")
    return out


def render(rows: list[dict[str, Any]], server: str, lease: float, hold: float) -> str:
    lines = [
        f"Renewal capacity, {server}: N locks of a {lease:g} s lease held {hold:g} s "
        f"in one process",
        f"{'N':>7} {'lost':>6} {'acq/s':>6} {'renewed/s':>9} {'owed/s':>7} {'calls/s':>7} "
        f"{'dog CPU':>7} {'proc CPU':>8} {'us/ren':>6} {'floor':>5} {'x':>5} "
        f"{'redis us':>8} {'warned':>6} {'lost at':>7} {'log':>4}",
    ]
    for row in rows:
        lines.append(
            f"{row['count']:>7} {row['lost']:>6} {row['acquire_per_s']:>6} "
            f"{row['renewals_per_s']:>9} {row['owed_per_s']:>7} {row['calls_per_s']:>7} "
            f"{row['watchdog_cpu']:>7.1%} {row['process_cpu']:>8.1%} "
            f"{row['watchdog_us_per_renewal']:>6} {row['floor_us']:>5} "
            f"{row['watchdog_vs_floor']:>5} {row['redis_us_per_renewal']:>8} "
            f"{row['lag_warning_s'] if row['lag_warning_s'] is not None else '-':>6} "
            f"{row['first_loss_s'] if row['first_loss_s'] is not None else '-':>7} "
            f"{row['loss_log_lines']:>4}"
        )
        lines.append(
            f"  one EVALSHA per lease, pipelined (the way before), on the same leases: "
            f"{row['one_call_each_us']} us of Python and "
            f"{row['one_call_each_redis_us']} us of Redis per renewal"
        )
        lines.extend(f"  {verdict}" for verdict in verdicts(row, lease))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--counts", type=int, nargs="+", default=[20000],
        help="how many locks to hold, one run each",
    )  # fmt: skip
    parser.add_argument("--lease", type=float, default=3.0, help="each lock's lease (s)")
    parser.add_argument("--hold", type=float, default=10.0, help="how long they are held (s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer, server_name

    # The lag warning and the loss lines are counted, not printed.
    logging.getLogger("django_redislock").propagate = False

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
