"""What a scripted lock costs the server, against how little one could cost.

``python -m bench`` measures a ``Lock``'s Redis time per cycle the way users
call it. This asks the question under that number: how low can the server's
time go for *any* lock that keeps this library's guarantees (fair, fenced,
one round trip per acquire and per release), and does running the same
scripts as Redis Functions (``FCALL``) change it? Only ``INFO commandstats``
time counts, never the client's. Two groups, each against its own floor:

``Lock``
  - ``floor``: ``SET NX PX`` and an ``EVALSHA`` compare-and-delete, the floor
    of ``python -m bench``;
  - ``least scripted``: an acquire script making nothing but the ``SET NX PX``
    (no queue, no fence) and the least release below: the lower bound of any
    lock whose acquire is a script, whatever else it keeps;
  - ``least fair fenced``: an acquire script making only the calls a fair,
    fenced acquire needs (``EXISTS`` on the queue; ``INCR`` of the fence and
    its ``PTTL``, with the ``TIME`` and ``SET`` that move it up to the clock
    at most once per 10 ms of use, so that tokens keep increasing across a
    failover; ``SET NX PX``) and a release script making
    only ``GET`` and ``DEL`` with an owner check;
  - ``Lock``: the plain ``SET NX PX`` of the value a ``Lock`` writes, and
    ``lock_release.lua`` with the arguments a ``Lock`` sends (``EVALSHA``);
  - ``Lock, fencing=True``: ``lock_acquire.lua`` (fenced, on its fast path)
    and ``lock_release.lua``;
  - ``Lock, fencing=True (FCALL)``: the same two scripts loaded as one
    Functions library (left out on a server without ``FUNCTION``).

``Semaphore``
  - ``floor``: the least correct leased semaphore, the floor of
    ``bench/bench_semaphore.py`` (one script: ``TIME``, ``ZREMRANGEBYSCORE``,
    ``ZCARD``, ``ZADD``; a bare ``ZREM``);
  - ``raw ZADD/ZREM``: a bare ``ZADD`` and ``ZREM``, no limit checked;
  - ``least scripted``: the same two commands, each in a script;
  - ``least fair fenced``: an acquire script making only the calls of
    ``semaphore_acquire.lua``'s fast path (``EXISTS`` on holders and queue,
    ``INCR``, ``PTTL``, ``ZADD``, ``PEXPIRE``) and a release script making only
    its two (``ZSCORE``, ``DEL``);
  - ``Semaphore``: ``semaphore_acquire.lua`` (its fencing token left to
    first use, as a ``Semaphore`` acquires by default) and ``permit_release.lua``;
  - ``Semaphore, fencing=True``: the same, the acquire taking the token.

  A fenced release names its permit by its fencing token, in the same pipeline as
  the acquire, so the fenced contenders start each block with the fence
  counter ahead of the clock (``FENCE_BASE``), with the ``TTL`` of a counter
  just moved up to it: their tokens are then the counter's, known in advance.
  The ``TIME`` and ``SET`` that move the counter up to the clock, at most once
  per 10 ms of a name's use, fall on about one cycle in 2,500 pipelined.

Every cycle is uncontended and on the scripts' fast paths; the probe fails if
one is not. Contenders run in turn, ``--rounds`` times, ``--cycles`` each,
pipelined (the server's time alone, packed) or with ``--sequential`` one round
trip per command, as the benches send them (what their targets are measured
on). Reported per contender: the minimum and the median over rounds of the
server's µs per cycle, and their ratios to the floor's minimum and median
(the minimum is the steadier one on a shared machine: noise only adds).
``REDISLOCK_SERVER=valkey`` runs it on ``valkey-server`` (``tests/support/servers.py``).

    python -m bench.script_cost [--rounds 60] [--cycles 1000] [--sequential] [--json]
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
from dataclasses import dataclass
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
  if redis.call('PTTL', base .. 'fence') < 9990 then
    local t = redis.call('TIME')
    fence = math.max(fence, tonumber(t[1]) * 1000000 + tonumber(t[2]))
    redis.call('SET', base .. 'fence', string.format('%.0f', fence), 'PX', 10000)
  end
  if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%.0f', fence),
      'NX', 'PX', ARGV[2]) then
    return fence
  end
end
return 0
"""

#: The least any scripted acquire does: take a free lock, nothing else.
LEAST_SCRIPTED_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1] .. ':1', 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""

#: A holder description as long as a real one (host:pid:thread).
HOLDER = "web-1.example.com:12345:MainThread"

#: The least an owner-checked release of such a value can do.
LEAST_RELEASE = """
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: The least a scripted semaphore can do: one script adding the holder, one removing it.
BARE_PERMIT_ACQUIRE = "return redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])"
BARE_PERMIT_RELEASE = "return redis.call('ZREM', KEYS[1], ARGV[1])"

#: The least a fair, fenced semaphore permit can do in one script when nobody
#: holds and nobody waits (what ``semaphore_acquire.lua``'s fast path does:
#: the sole holder's lease is the key's TTL), and its release.
LEAST_PERMIT_ACQUIRE = """
if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  local fence = redis.call('INCR', KEYS[2])
  if redis.call('PTTL', KEYS[2]) < 9990 then
    local t = redis.call('TIME')
    fence = math.max(fence, tonumber(t[1]) * 1000000 + tonumber(t[2]))
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', 10000)
  end
  redis.call('ZADD', KEYS[1], '+inf', ARGV[1] .. ':' .. string.format('%.0f', fence))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
return 0
"""
LEAST_PERMIT_RELEASE = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

#: Where a block's fencing tokens start (a fence key set before each block,
#: so a release knows its permit's member without a round trip): ahead of the
#: server clock in µs, so tokens are the counter's, and below 2**53, so Lua's
#: numbers hold them exactly.
FENCE_BASE = 8 * 10**15


def _nothing(client: Any) -> None:
    pass


@dataclass(frozen=True)
class Contender:
    """``cycle(pipe, i)`` queues the ``i``-th acquire+release of a block;
    ``sends``: the commands it sends per cycle, by name; ``freed``: what its
    release answers when it lets go; ``prepare(client)`` runs before each block;
    ``held(reply)``: whether its acquire's reply is a grant."""

    cycle: Callable[[Any, int], None]
    sends: dict[str, int]
    freed: int
    prepare: Callable[[Any], None] = _nothing
    held: Callable[[Any], bool] = bool


def functions_library(bodies: dict[str, str]) -> str:
    """The scripts as one Functions library: the preludes once, at load, and
    each script's body as a function of ``KEYS`` and ``ARGV``."""
    from django_redislock.backend.scripts import _PRELUDES, PRELUDE_MARK, _preludes_for, _read

    used = {name for body in bodies.values() for name in _preludes_for(body)}
    parts = ["#!lua name=redislock_script_cost", *(_read(p) for p in _PRELUDES if p in used)]
    for name, body in bodies.items():
        body = body.replace(PRELUDE_MARK, "")
        parts.append(f"redis.register_function('{name}', function(KEYS, ARGV)\n{body}\nend)")
    return "\n".join(parts)


def lock_contenders(client: Any) -> dict[str, Contender]:
    """The floor, the least fair fenced lock, and ``Lock``'s scripts (``EVALSHA``, ``FCALL``)."""
    from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE, _read

    lease_ms = LEASE_SECONDS * 1000
    key = "redislock:{bench:script-cost}:lock"
    token = secrets.token_hex(16)
    since_ms = int(time.time() * 1000)
    acquire_args = LOCK_ACQUIRE.args_of(
        token=token, lease_ms=lease_ms, mode="wait", fenced=1, holder=HOLDER,
        since_ms=since_ms, waiter_ttl_ms=6000, stats_ttl_ms=86_400_000,
    )  # fmt: skip
    value = f"{token}:0:1:0:{lease_ms}:{since_ms}:{HOLDER}"  # what Lock's plain SET writes
    release_args = LOCK_RELEASE.args_of(token=token, final=1)
    texts = (RAW_RELEASE, LEAST_SCRIPTED_ACQUIRE, LEAST_ACQUIRE, LEAST_RELEASE)
    texts += (LOCK_ACQUIRE.text, LOCK_RELEASE.text)
    sha = {text: client.script_load(text) for text in texts}

    def floor(pipe: Any, i: int) -> None:
        pipe.set(key, token, nx=True, px=lease_ms)
        pipe.evalsha(sha[RAW_RELEASE], 1, key, token)

    def scripted(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[LEAST_SCRIPTED_ACQUIRE], 1, key, token, lease_ms)
        pipe.evalsha(sha[LEAST_RELEASE], 1, key, token)

    def least(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[LEAST_ACQUIRE], 1, key, token, lease_ms)
        pipe.evalsha(sha[LEAST_RELEASE], 1, key, token)

    def lock(pipe: Any, i: int) -> None:
        pipe.set(key, value, nx=True, px=lease_ms)
        pipe.evalsha(sha[LOCK_RELEASE.text], 1, key, *release_args)

    def lock_fenced(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[LOCK_ACQUIRE.text], 1, key, *acquire_args)
        pipe.evalsha(sha[LOCK_RELEASE.text], 1, key, *release_args)

    found = {
        "floor": Contender(floor, {"set": 1, "evalsha": 1}, 1),
        "least scripted": Contender(scripted, {"evalsha": 2}, 1),
        "least fair fenced": Contender(least, {"evalsha": 2}, 1),
        "Lock": Contender(lock, {"set": 1, "evalsha": 1}, 0),
        "Lock, fencing=True": Contender(lock_fenced, {"evalsha": 2}, 0),
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

    def lock_fcall(pipe: Any, i: int) -> None:
        pipe.fcall("acquire", 1, key, *acquire_args)
        pipe.fcall("release", 1, key, *release_args)

    found["Lock, fencing=True (FCALL)"] = Contender(lock_fcall, {"fcall": 2}, 0)
    return found


def semaphore_contenders(client: Any) -> dict[str, Contender]:
    """The floor of ``bench/bench_semaphore.py`` (a bare ``ZADD`` and ``ZREM``),
    the least scripted semaphore, the least fair fenced one, and ``Semaphore``'s scripts."""
    from django_redislock.backend.scripts import PERMIT_RELEASE, SEMAPHORE_ACQUIRE

    lease_ms = LEASE_SECONDS * 1000
    token = secrets.token_hex(16)
    tail = f"5:{int(time.time() * 1000)}:{HOLDER}"  # limit 5, since_ms, holder

    def keys(name: str) -> list[str]:
        base = f"redislock:{{bench:{name}}}:"
        return [base + part for part in ("sem", "fence", "queue", "deadlines")]

    from bench.bench_semaphore import LEAST_LEASED_ACQUIRE

    bare, least, ours, leased = keys("bare"), keys("least"), keys("ours"), keys("leased")
    texts = (BARE_PERMIT_ACQUIRE, BARE_PERMIT_RELEASE, LEAST_PERMIT_ACQUIRE, LEAST_PERMIT_RELEASE)
    texts += (LEAST_LEASED_ACQUIRE,)
    sha = {text: client.script_load(text) for text in texts}

    def fence_at_base(fence_key: str) -> Callable[[Any], None]:
        return lambda client: client.set(fence_key, FENCE_BASE, px=10_000)

    def floor(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[LEAST_LEASED_ACQUIRE], 1, leased[0], 5, lease_ms, token)
        pipe.zrem(leased[0], token)

    def raw(pipe: Any, i: int) -> None:
        pipe.zadd(bare[0], {token: time.time()})
        pipe.zrem(bare[0], token)

    def bare_scripts(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[BARE_PERMIT_ACQUIRE], 1, bare[0], token, time.time())
        pipe.evalsha(sha[BARE_PERMIT_RELEASE], 1, bare[0], token)

    def least_fenced(pipe: Any, i: int) -> None:
        pipe.evalsha(sha[LEAST_PERMIT_ACQUIRE], 3, *least[:3], token, lease_ms)
        pipe.evalsha(sha[LEAST_PERMIT_RELEASE], 1, least[0], f"{token}:{FENCE_BASE + i + 1}")

    member = f"{token}:0:{tail}"  # what an unfenced acquire writes

    def acquire_args(fenced: int) -> list[Any]:
        return SEMAPHORE_ACQUIRE.args_of(
            member=member, lease_ms=lease_ms, wait_ms=6000, fenced=fenced
        )

    unfenced_args, fenced_args = acquire_args(0), acquire_args(1)
    release_keys = PERMIT_RELEASE.keys_of(
        dict(zip(("holders", "fence", "queue", "deadlines"), ours, strict=True))
    )

    def semaphore(pipe: Any, i: int) -> None:
        pipe.evalsha(SEMAPHORE_ACQUIRE.sha, 4, *ours, *unfenced_args)
        pipe.evalsha(PERMIT_RELEASE.sha, len(release_keys), *release_keys, member)

    def semaphore_fenced(pipe: Any, i: int) -> None:
        pipe.evalsha(SEMAPHORE_ACQUIRE.sha, 4, *ours, *fenced_args)
        fenced_member = f"{token}:{FENCE_BASE + i + 1}:{tail}"
        pipe.evalsha(PERMIT_RELEASE.sha, len(release_keys), *release_keys, fenced_member)

    client.script_load(SEMAPHORE_ACQUIRE.text)
    client.script_load(PERMIT_RELEASE.text)
    return {
        "floor": Contender(floor, {"evalsha": 1, "zrem": 1}, 1),
        "raw ZADD/ZREM": Contender(raw, {"zadd": 1, "zrem": 1}, 1),
        "least scripted": Contender(bare_scripts, {"evalsha": 2}, 1),
        "least fair fenced": Contender(least_fenced, {"evalsha": 2}, 1, fence_at_base(least[1])),
        # an unfenced grant's reply is its fencing token: 0, none taken
        "Semaphore": Contender(semaphore, {"evalsha": 2}, 1, held=lambda reply: reply == 0),
        "Semaphore, fencing=True": Contender(
            semaphore_fenced, {"evalsha": 2}, 1, fence_at_base(ours[1])
        ),
    }


class _Sequential:
    """Stands in for a pipeline: runs each command at once, one round trip
    each, and keeps the replies."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.replies: list[Any] = []

    def __getattr__(self, command: str) -> Callable[..., None]:
        run = getattr(self.client, command)
        return lambda *args, **kwargs: self.replies.append(run(*args, **kwargs))


def measure(
    client: Any, contenders: dict[str, Contender], rounds: int, cycles: int, pipelined: bool
) -> dict[str, list[float]]:
    """Per contender, the server's µs per cycle of each round (``top``: the
    commands sent, scripts' inner calls included once). Every acquire must
    take the lock and every release free it: a cycle off the fast path would
    measure something else."""
    per_round: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for name, contender in contenders.items():
            contender.prepare(client)
            reset(client)
            if pipelined:
                pipe = client.pipeline(transaction=False)
                for i in range(cycles):
                    contender.cycle(pipe, i)
                replies = pipe.execute()
            else:
                sequential = _Sequential(client)
                for i in range(cycles):
                    contender.cycle(sequential, i)
                replies = sequential.replies
            held = all(contender.held(reply) for reply in replies[::2])
            if not (held and set(replies[1::2]) == {contender.freed}):
                raise RuntimeError(f"{name}: a cycle left its fast path: {replies[:4]}")
            spent = RedisTime()
            sends = contender.sends
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


#: Each group of contenders, measured against its own floor.
GROUPS: dict[str, Callable[[Any], dict[str, Contender]]] = {
    "Lock": lock_contenders,
    "Semaphore": semaphore_contenders,
}


def render(groups: dict[str, dict[str, dict[str, float]]], server: str, sequential: bool) -> str:
    mode = "one round trip per command" if sequential else "pipelined"
    lines = [f"Redis time per uncontended cycle, {mode}, on {server}"]
    for group, summary in groups.items():
        lines.append(
            f"  {group:22s} {'min us':>8s} {'x floor':>8s} {'median us':>10s} {'x floor':>8s}"
        )
        for name, row in summary.items():
            lines.append(
                f"    {name:20s} {row['min_us']:8.2f} {row['min_x_floor']:8.2f}"
                f" {row['median_us']:10.2f} {row['median_x_floor']:8.2f}"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds")
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per contender and round")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="one round trip per command, as python -m bench sends them, instead of pipelined",
    )
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer, server_name

    with RedisServer() as server:
        client = server.client()
        name = server_name(client)
        groups = {
            group: summarize(
                measure(client, found(client), args.rounds, args.cycles, not args.sequential)
            )
            for group, found in GROUPS.items()
        }
        client.close()
    if args.json:
        mode = "sequential" if args.sequential else "pipelined"
        json.dump({"server": name, "mode": mode, "groups": groups}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(groups, name, args.sequential))
    return 0


if __name__ == "__main__":
    sys.exit(main())
