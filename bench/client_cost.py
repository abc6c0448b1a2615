"""Where a per-use ``Lock``'s time goes on the client, against the floor.

``python -m bench`` finds a new ``Lock`` per cycle slower than the raw floor
and than redis-py's ``Lock``. This splits that gap, measuring wall time per
uncontended cycle, in the same process and interleaved rounds:

- ``floor``: ``SET NX PX`` and an ``EVALSHA`` compare-and-delete
  (``bench.libs``);
- ``redis-py Lock``: ``with client.lock(name, timeout=30, blocking_timeout=5):``;
- ``Lock's scripts, bare``: the plain ``SET NX PX`` of the value a ``Lock``
  writes and ``lock_release.lua`` with the arguments a ``Lock`` sends, by
  redis-py in a loop: the transport and the server's share of a ``Lock`` cycle;
- ``Lock``: ``with Lock(name, timeout=30, blocking_timeout=5):``, as the bench
  and a view write it;
- ``Lock, canned replies``: the same with every script call answered at once
  by the reply Redis would give (``Script.__call__`` and ``Command.__call__``
  patched for that name's lock key, in this process only): the library's own Python, without a round
  trip (its counters still reach Redis in the background flush, once a second,
  as any ``Lock``'s do);
- ``redis-py Lock, canned replies``: redis-py's ``Lock`` per use on a client
  whose ``SET`` and ``EVALSHA`` are answered at once (``execute_command``
  overridden): its own Python, to set beside ``Lock``'s;
- ``floor + Lock canned``: one floor cycle, then one canned ``Lock`` cycle:
  what that Python costs in wall time when it runs between real round trips,
  as it does in a real ``Lock`` cycle.

Reported per contender: the median over rounds of the µs per cycle and, as
``python -m bench`` reports ``x raw``, the median over rounds of the floor's
µs per cycle divided by the contender's in the same round (a cycles/s ratio;
none for the canned cycles, which have no round trip to compare). Then
``Lock``'s gap to the floor, split into its commands' share (scripts bare -
floor), its own Python's between round trips (floor + canned - floor) and
what is left (noise, mostly); and that Python's cost on its own (canned).

    python -m bench.client_cost [--rounds 15] [--cycles 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.libs import LEASE_SECONDS, _raw_per_use, _redislock_per_use, _redispy_per_use
from bench.workers import setup_django

#: The name whose script calls get canned replies.
CANNED = "bench:client-cost:canned"
#: The contenders that make no round trip (no ratio to the floor).
CANNED_CYCLES = ("Lock, canned replies", "redis-py Lock, canned replies")
#: What the acquire script answers when it takes a free lock: a fencing token.
CANNED_FENCE = 1_732_000_000_000_000


@contextmanager
def canned_replies(canned_key: bytes) -> Iterator[None]:
    """Answer the script calls on ``canned_key`` (a lock key) at once, as a
    free lock's would be answered; every other call goes to Redis as before."""
    from django_redislock.backend import scripts

    reals = {scripts.Script: scripts.Script.__call__, scripts.Command: scripts.Command.__call__}
    replies = {
        scripts.LOCK_TAKE: True,  # the plain SET NX PX took it
        scripts.LOCK_ACQUIRE: CANNED_FENCE,  # held, with this fencing token
        scripts.LOCK_RELEASE: 0,  # released: no level left
        scripts.LOCK_EXTEND: 1,  # renewed
    }

    def answer(script: Any, client: Any, keys: Any, args: Any) -> Any:
        if keys[0] != canned_key:
            return reals[type(script)](script, client, keys, args)
        if script not in replies:
            raise RuntimeError(f"no canned reply for {script.name}")
        return replies[script]

    for kind in reals:
        kind.__call__ = answer  # type: ignore[method-assign]
    try:
        yield
    finally:
        for kind, real in reals.items():
            kind.__call__ = real  # type: ignore[method-assign]


def canned_key() -> bytes:
    """The lock key ``CANNED``'s scripts are sent, as ``Lock`` sends it."""
    from django_redislock import Lock
    from django_redislock.backend.scripts import LOCK_ACQUIRE

    key: bytes = Lock(CANNED)._resolve().keys_for(LOCK_ACQUIRE)[0]
    return key


def canned_redispy(client: Any) -> Callable[[], None]:
    """redis-py's ``Lock`` per use, every command answered at once as a free
    lock's would be: ``SET NX`` took it, the release script freed it."""
    replies = {"SET": True, "EVALSHA": 1}

    class Canned(type(client)):  # type: ignore[misc]
        def execute_command(self, *args: Any, **options: Any) -> Any:
            if args[0] in replies:
                return replies[args[0]]
            return super().execute_command(*args, **options)

    canned = Canned(connection_pool=client.connection_pool)
    return _redispy_per_use(0.1)(canned, "bench:client-cost:redispy-canned")


def contenders(client: Any) -> dict[str, Callable[[], None]]:
    from django_redislock.backend.scripts import LOCK_RELEASE
    from django_redislock.holds.holding import holder_description

    floor = _raw_per_use(client, "bench:client-cost:floor")
    redispy = _redispy_per_use(0.1)(client, "bench:client-cost:redispy")
    key = "redislock:{bench:client-cost:bare}:lock"
    release_sha = client.script_load(LOCK_RELEASE.text)
    holder = holder_description()

    lease_ms = LEASE_SECONDS * 1000

    def bare() -> None:
        token = secrets.token_hex(16)
        value = f"{token}:0:1:0:{lease_ms}:{int(time.time() * 1000)}:{holder}"
        if not client.execute_command("SET", key, value, "NX", "PX", lease_ms):
            raise RuntimeError("Lock's SET NX did not take a free lock")
        client.evalsha(release_sha, 1, key, *LOCK_RELEASE.args_of(token=token, final=1))

    lock = _redislock_per_use(client, "bench:client-cost:lock")  # as python -m bench
    canned = _redislock_per_use(client, CANNED)

    def floor_then_canned() -> None:
        floor()
        canned()

    return {
        "floor": floor,
        "redis-py Lock": redispy,
        "Lock's scripts, bare": bare,
        "Lock": lock,
        "Lock, canned replies": canned,
        "redis-py Lock, canned replies": canned_redispy(client),
        "floor + Lock canned": floor_then_canned,
    }


def measure(cycles: dict[str, Callable[[], None]], rounds: int, n: int) -> dict[str, list[float]]:
    """µs per cycle of each contender in each round, after up to 200 warm-up cycles each."""
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

    def x_floor(name: str) -> float | None:
        if name in CANNED_CYCLES:
            return None
        pairs = zip(per_round["floor"], per_round[name], strict=True)
        return statistics.median(f / us for f, us in pairs)

    gap = median["Lock"] - floor
    commands = median["Lock's scripts, bare"] - floor
    python = median["floor + Lock canned"] - floor
    return {
        "contenders": {
            name: {"median_us": us, "x_floor": x_floor(name)} for name, us in median.items()
        },
        "gap_us": gap,
        "split_us": {
            "commands (scripts bare - floor)": commands,
            "own Python between round trips (floor + canned - floor)": python,
            "rest": gap - commands - python,
        },
        "own_python_alone_us": median["Lock, canned replies"],
        "redispy_python_alone_us": median["redis-py Lock, canned replies"],
    }


def render(summary: dict[str, Any], server: str, rounds: int, n: int) -> str:
    lines = [f"Wall time per uncontended cycle, median of {rounds} rounds x {n}, on {server}"]
    lines.append(f"  {'contender':28s} {'us':>8s} {'x floor':>8s}  (cycles/s ratio)")
    for name, row in summary["contenders"].items():
        ratio = "" if row["x_floor"] is None else f"{row['x_floor']:8.2f}"
        lines.append(f"  {name:28s} {row['median_us']:8.1f} {ratio}")
    lines.append(f"Lock's gap to the floor, {summary['gap_us']:.1f} us, split:")
    for name, us in summary["split_us"].items():
        lines.append(f"  {name:58s} {us:7.1f} us")
    lines.append(f"Lock's own Python alone (canned): {summary['own_python_alone_us']:.1f} us")
    lines.append(
        f"redis-py Lock's own Python alone (canned): {summary['redispy_python_alone_us']:.1f} us"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per contender and round")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer, server_name

    with RedisServer() as server:
        setup_django(server.url)
        from django_redis import get_redis_connection

        client = get_redis_connection("default")
        name = server_name(client)
        # One real cycle first: it leaves a connected client in the pools the
        # canned cycles' bounded steps would use (engine/bounds.must_connect),
        # as any process that has used a lock once has.
        _redislock_per_use(client, CANNED)()
        with canned_replies(canned_key()):
            summary = summarize(measure(contenders(client), args.rounds, args.cycles))
    if args.json:
        json.dump({"server": name, **summary}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(summary, name, args.rounds, args.cycles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
