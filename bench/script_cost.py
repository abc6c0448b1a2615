"""What a scripted lock costs the server, against how little one could cost.

``python -m bench`` measures a ``Lock``'s Redis time per cycle the way users
call it. This asks the question under that number: how low can the server's
time go for *any* lock that keeps this library's guarantees in one round trip
per step, and does running the same scripts as Redis Functions (``FCALL``)
change it? Each contender runs pipelined (so round trips and the client do
not count; only ``INFO commandstats`` time), in interleaved rounds of
``--cycles`` acquire+release cycles on one private server:

- ``floor``: ``SET NX PX`` and an ``EVALSHA`` compare-and-delete, the floor of
  ``python -m bench``;
- ``least fair fenced``: the least any scripted fair, fenced lock can run: an
  acquire script making only the three calls a fair and fenced acquire needs
  (``EXISTS`` on the queue, ``INCR`` of the fence, ``SET NX PX``), and a release
  script making only ``GET`` and ``DEL`` with an owner check;
- ``Lock``: ``lock_acquire.lua`` and ``lock_release.lua`` with the arguments a
  ``Lock`` sends (``EVALSHA``);
- ``Lock (FCALL)``: the same two scripts loaded as one Functions library
  (left out on a server without ``FUNCTION``).

Every cycle is uncontended and on the scripts' fast paths. Reported per
contender: the minimum and the median over rounds of the server's µs per
cycle and its ratio to the floor's (the minimum is the steadier one on a
shared machine: noise only ever adds). ``REDISLOCK_SERVER=valkey`` runs it on
``valkey-server`` (``tests/servers.py``).

    python -m bench.script_cost [--rounds 60] [--cycles 1000] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.libs import LEASE_SECONDS, RAW_RELEASE
from bench.redistime import RedisTime, reset, server_stats

#: The least a fair, fenced acquire can do in one script: nobody queued, a new
#: fencing token, the lock taken with it (what ``lock_acquire.lua``'s fast path
#: does, with nothing else).
LEAST_ACQUIRE = """
local base = string.sub(KEYS[1], 1, -5)
if redis.call('EXISTS', base .. 'queue') == 0 then
  local fence = redis.call('INCR', base .. 'fence')
  if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. fence, 'NX', 'PX', ARGV[2]) then
    return fence
  end
end
return 0
"""

#: The least an owner-checked release of such a value can do.
LEAST_RELEASE = """
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: One pipelined cycle: queue the cycle's acquire and release.
Cycle = Callable[[Any], None]
#: A contender: its cycle, the commands it sends per cycle by name, and what
#: its release answers when it frees the lock (1: keys deleted; 0: holds left).
Contender = tuple[Cycle, dict[str, int], int]


def functions_library(bodies: dict[str, str]) -> str:
    """The scripts as one Functions library: the preludes once, at load, and
    each script's body as a function of ``KEYS`` and ``ARGV``."""
    from django_redislock.scripts import _PRELUDES, PRELUDE_MARK, _preludes_for, _read

    used = {name for body in bodies.values() for name in _preludes_for(body)}
    parts = ["#!lua name=redislock_script_cost", *(_read(p) for p in _PRELUDES if p in used)]
    for name, body in bodies.items():
        body = body.replace(PRELUDE_MARK, "")
        parts.append(f"redis.register_function('{name}', function(KEYS, ARGV)\n{body}\nend)")
    return "\n".join(parts)


def contenders(client: Any) -> dict[str, Contender]:
    """Each contender's cycle and the commands it sends per cycle, by name."""
    from django_redislock.scripts import LOCK_ACQUIRE, LOCK_RELEASE, _read

    lease_ms = LEASE_SECONDS * 1000
    key = "redislock:{bench:script-cost}:lock"
    token = secrets.token_hex(16)
    holder = "web-1.example.com:12345:MainThread"
    acquire_args = LOCK_ACQUIRE.args_of(
        token=token, lease_ms=lease_ms, mode="wait", holder=holder,
        since_ms=int(time.time() * 1000), waiter_ttl_ms=6000, stats_ttl_ms=86_400_000,
    )  # fmt: skip
    release_args = LOCK_RELEASE.args_of(token=token, final=1)
    texts = (RAW_RELEASE, LEAST_ACQUIRE, LEAST_RELEASE, LOCK_ACQUIRE.text, LOCK_RELEASE.text)
    sha = {text: client.script_load(text) for text in texts}

    def floor(pipe: Any) -> None:
        pipe.set(key, token, nx=True, px=lease_ms)
        pipe.evalsha(sha[RAW_RELEASE], 1, key, token)

    def least(pipe: Any) -> None:
        pipe.evalsha(sha[LEAST_ACQUIRE], 1, key, token, lease_ms)
        pipe.evalsha(sha[LEAST_RELEASE], 1, key, token)

    def lock(pipe: Any) -> None:
        pipe.evalsha(sha[LOCK_ACQUIRE.text], 1, key, *acquire_args)
        pipe.evalsha(sha[LOCK_RELEASE.text], 1, key, *release_args)

    found: dict[str, Contender] = {
        "floor": (floor, {"set": 1, "evalsha": 1}, 1),
        "least fair fenced": (least, {"evalsha": 2}, 1),
        "Lock": (lock, {"evalsha": 2}, 0),
    }
    try:
        client.function_load(
            functions_library(
                {"acquire": _read("lock_acquire.lua"), "release": _read("lock_release.lua")}
            ),
            replace=True,
        )
    except Exception as exc:  # a server without FUNCTION: no FCALL contender
        print(f"no FCALL contender: {exc}", file=sys.stderr)
        return found

    def lock_fcall(pipe: Any) -> None:
        pipe.fcall("acquire", 1, key, *acquire_args)
        pipe.fcall("release", 1, key, *release_args)

    found["Lock (FCALL)"] = (lock_fcall, {"fcall": 2}, 0)
    return found


def measure(client: Any, rounds: int, cycles: int) -> dict[str, list[float]]:
    """Per contender, the server's µs per cycle of each round (``top``: the
    commands sent, scripts' inner calls included once). Every acquire must
    take the lock and every release free it: a cycle off the fast path would
    measure something else."""
    found = contenders(client)
    per_round: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for name, (cycle, sends, freed) in found.items():
            pipe = client.pipeline(transaction=False)
            for _ in range(cycles):
                cycle(pipe)
            reset(client)
            replies = pipe.execute()
            if not (all(replies[::2]) and set(replies[1::2]) == {freed}):
                raise RuntimeError(f"{name}: a cycle left its fast path: {replies[:4]}")
            spent = RedisTime()
            sent = collections.Counter({command: n * cycles for command, n in sends.items()})
            spent.add(server_stats(client), sent, cycles)
            per_round[name].append(spent.top_usec / cycles)
    return dict(per_round)


def summarize(per_round: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    floor_min, floor_median = min(per_round["floor"]), statistics.median(per_round["floor"])
    return {
        name: {
            "min_us": min(times),
            "min_x_floor": min(times) / floor_min,
            "median_us": statistics.median(times),
            "median_x_floor": statistics.median(times) / floor_median,
        }
        for name, times in per_round.items()
    }


def render(summary: dict[str, dict[str, float]], server: str) -> str:
    lines = [
        f"Redis time per uncontended cycle, pipelined, on {server}",
        f"  {'contender':20s} {'min us':>8s} {'x floor':>8s} {'median us':>10s} {'x floor':>8s}",
    ]
    for name, row in summary.items():
        lines.append(
            f"  {name:20s} {row['min_us']:8.2f} {row['min_x_floor']:8.2f}"
            f" {row['median_us']:10.2f} {row['median_x_floor']:8.2f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds")
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per contender and round")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    from tests.servers import RedisServer

    with RedisServer() as server:
        client = server.client()
        info = client.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        name = f"{info.get('server_name', 'redis')} {version}"
        summary = summarize(measure(client, args.rounds, args.cycles))
        client.close()
    if args.json:
        json.dump({"server": name, "contenders": summary}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(summary, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
