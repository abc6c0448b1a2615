"""Where a per-use ``Lock``'s time goes on the client, against the floor.

``python -m bench`` finds a new ``Lock`` per cycle slower than the raw floor
and than redis-py's ``Lock``. This splits that gap, measuring wall time per
uncontended cycle, in the same process and interleaved rounds:

- ``floor``: ``SET NX PX`` and an ``EVALSHA`` compare-and-delete
  (``bench.libs``);
- ``redis-py Lock``: ``with client.lock(name, timeout=30, blocking_timeout=5):``;
- ``Lock's scripts, bare``: ``lock_acquire.lua`` and ``lock_release.lua`` sent
  with the arguments a ``Lock`` sends, by ``Redis.evalsha`` in a loop: the
  transport and the server's share of a ``Lock`` cycle;
- ``Lock``: ``with Lock(name, timeout=30, blocking_timeout=5):``, as the bench
  and a view write it;
- ``Lock, canned replies``: the same with every script call answered at once
  by the reply Redis would give (``Script.__call__`` patched for that name
  only, in this process only): the library's own Python, no I/O;
- ``floor + Lock canned``: one floor cycle, then one canned ``Lock`` cycle:
  what that Python costs in wall time when it runs between real round trips,
  as it does in a real ``Lock`` cycle.

Reported per contender: the median over rounds of the µs per cycle, and its
ratio to the floor. Then the split of ``Lock``'s gap to the floor: transport
and server (scripts bare - floor), own Python alone (canned), and own Python
between round trips (floor + canned - floor).

    python -m bench.client_cost [--rounds 15] [--cycles 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.libs import BLOCKING_TIMEOUT, LEASE_SECONDS, _raw_per_use, _redispy_per_use

#: The name whose script calls get canned replies.
CANNED = "bench:client-cost:canned"
#: What the acquire script answers when it takes a free lock: a fencing token.
CANNED_FENCE = 1_732_000_000_000_000


@contextmanager
def canned_replies() -> Iterator[None]:
    """Answer ``CANNED``'s script calls at once, as a free lock's would be
    answered; every other name goes to Redis as before."""
    from django_redislock import scripts

    real = scripts.Script.__call__
    acquire = scripts.LOCK_ACQUIRE

    def answer(script: Any, client: Any, keys: Any, args: Any) -> Any:
        if CANNED in str(keys[0]):
            return CANNED_FENCE if script is acquire else 0  # released, count 0
        return real(script, client, keys, args)

    scripts.Script.__call__ = answer  # type: ignore[method-assign]
    try:
        yield
    finally:
        scripts.Script.__call__ = real  # type: ignore[method-assign]


def contenders(client: Any) -> dict[str, Callable[[], None]]:
    from django_redislock import Lock
    from django_redislock.holding import holder_description
    from django_redislock.scripts import LOCK_ACQUIRE, LOCK_RELEASE

    floor = _raw_per_use(client, "bench:client-cost:floor")
    redispy = _redispy_per_use(0.1)(client, "bench:client-cost:redispy")
    key = "redislock:{bench:client-cost:bare}:lock"
    acquire_sha = client.script_load(LOCK_ACQUIRE.text)
    release_sha = client.script_load(LOCK_RELEASE.text)
    holder = holder_description()

    def bare() -> None:
        token = secrets.token_hex(16)
        acquire_args = LOCK_ACQUIRE.args_of(
            token=token, lease_ms=LEASE_SECONDS * 1000, mode="wait", holder=holder,
            since_ms=int(time.time() * 1000), waiter_ttl_ms=10_500, stats_ttl_ms=3_600_000,
        )  # fmt: skip
        if client.evalsha(acquire_sha, 1, key, *acquire_args) <= 0:
            raise RuntimeError("Lock's acquire script did not take a free lock")
        client.evalsha(release_sha, 1, key, *LOCK_RELEASE.args_of(token=token, final=1))

    def lock() -> None:
        with Lock("bench:client-cost:lock", timeout=LEASE_SECONDS, blocking_timeout=5):
            pass

    def canned() -> None:
        with Lock(CANNED, timeout=LEASE_SECONDS, blocking_timeout=BLOCKING_TIMEOUT):
            pass

    def floor_then_canned() -> None:
        floor()
        canned()

    return {
        "floor": floor,
        "redis-py Lock": redispy,
        "Lock's scripts, bare": bare,
        "Lock": lock,
        "Lock, canned replies": canned,
        "floor + Lock canned": floor_then_canned,
    }


def measure(cycles: dict[str, Callable[[], None]], rounds: int, n: int) -> dict[str, list[float]]:
    """µs per cycle of each contender in each round; one warm-up block first."""
    for cycle in cycles.values():
        for _ in range(min(n, 200)):
            cycle()
    per_round: dict[str, list[float]] = {name: [] for name in cycles}
    for _ in range(rounds):
        for name, cycle in cycles.items():
            started = time.perf_counter()
            for _ in range(n):
                cycle()
            per_round[name].append((time.perf_counter() - started) / n * 1e6)
    return per_round


def summarize(per_round: dict[str, list[float]]) -> dict[str, Any]:
    median = {name: statistics.median(times) for name, times in per_round.items()}
    floor = median["floor"]
    return {
        "contenders": {
            name: {"median_us": us, "x_floor": floor / us if us else 0.0}
            for name, us in median.items()
        },
        "split_us": {
            "gap to the floor": median["Lock"] - floor,
            "transport and server (scripts bare - floor)": median["Lock's scripts, bare"] - floor,
            "own Python alone (canned)": median["Lock, canned replies"],
            "own Python between round trips (floor + canned - floor)": (
                median["floor + Lock canned"] - floor
            ),
        },
    }


def render(summary: dict[str, Any], server: str, rounds: int, n: int) -> str:
    lines = [f"Wall time per uncontended cycle, median of {rounds} rounds x {n}, on {server}"]
    lines.append(f"  {'contender':28s} {'us':>8s} {'x floor':>8s}  (cycles/s ratio)")
    for name, row in summary["contenders"].items():
        lines.append(f"  {name:28s} {row['median_us']:8.1f} {row['x_floor']:8.2f}")
    lines.append("Lock's gap to the floor, split:")
    for name, us in summary["split_us"].items():
        lines.append(f"  {name:58s} {us:7.1f} us")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per contender and round")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    from tests.servers import RedisServer

    with RedisServer() as server:
        os.environ["REDISLOCK_BENCH_REDIS_URL"] = server.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        import django

        django.setup()
        from django_redis import get_redis_connection

        client = get_redis_connection("default")
        info = client.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        name = f"{info.get('server_name', 'redis')} {version}"
        with canned_replies():
            summary = summarize(measure(contenders(client), args.rounds, args.cycles))
    if args.json:
        json.dump({"server": name, **summary}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(summary, name, args.rounds, args.cycles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
