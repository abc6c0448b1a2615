"""The uncontended measurement: one process, a name nobody else uses, two modes.

- **per use**: a new lock object every cycle, as a view writes
  ``with Lock(f"sku:{pk}", timeout=30, blocking_timeout=5):``;
- **reused**: one lock object per block, acquired and released again and
  again (what earlier versions of this bench measured).

Every library runs one block per round and mode, the order rotating every
round so that slow phases of a shared machine hit all of them alike. Each
block records wall time, CPU time (this process + redis-server) and the
server's own command time (:mod:`bench.redistime`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.libs import LIBRARIES
from bench.redistime import RedisTime, measured, ratios

MODES = ("per_use", "reused")
FLOOR = "raw"


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def server_cpu_ns(pid: int | None) -> int | None:
    """CPU time redis-server has used, in ns (Linux); ``None`` where unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def timed(
    cycle: Callable[[], None], cycles: int, server_pid: int | None
) -> tuple[float, float | None]:
    """Cycles per second and CPU µs per cycle (``None`` without server CPU figures)."""
    server_before = server_cpu_ns(server_pid)
    cpu_before = time.process_time_ns()
    started = time.perf_counter()
    for _ in range(cycles):
        cycle()
    elapsed = time.perf_counter() - started
    cpu = time.process_time_ns() - cpu_before
    server_after = server_cpu_ns(server_pid)
    if server_before is None or server_after is None:
        return cycles / elapsed, None
    return cycles / elapsed, (cpu + server_after - server_before) / cycles / 1000


#: The library whose background writes (batched counters, the hot-names
#: history) are charged to its own blocks.
OURS = "redislock"


def flush_tallies() -> None:
    """Write what ``Lock`` tallied in this process (counters and history),
    which its background threads would otherwise write about once a second,
    during whichever library's block was running then."""

    from django_redislock.holds import counters

    counters.flush()


def _then_flushed(run: Callable[[], tuple[Any, int]]) -> Callable[[], tuple[Any, int]]:
    """``run``, then its tallies written, inside its own measured block."""

    def flushed() -> tuple[Any, int]:
        result = run()
        flush_tallies()
        return result

    return flushed


def _counted(
    cycle: Callable[[], None], cycles: int, server_pid: int | None
) -> tuple[tuple[float, float | None], int]:
    return timed(cycle, cycles, server_pid), cycles


def make_cycle(client: Any, lib: str, mode: str, name: str) -> Callable[[], None]:
    if mode == "per_use":
        return LIBRARIES[lib].per_use(client, name)
    acquire, release = LIBRARIES[lib].make(client, name)

    def cycle() -> None:
        acquire()
        release()

    return cycle


class _Samples:
    """One library's blocks in one mode."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.ratios: list[float] = []
        self.cpus: list[float] = []
        self.cpu_ratios: list[float] = []
        self.redis = RedisTime()

    def summary(self) -> dict[str, Any]:
        return {
            "cycles_per_s": statistics.median(self.rates),
            "ratio_to_raw": _median(self.ratios),
            "cpu_us_per_cycle": _median(self.cpus),
            "cpu_ratio_to_raw": _median(self.cpu_ratios),
            **self.redis.per_cycle(),
            "redis_calls_per_cycle": self.redis.commands_per_cycle(),
            "blocks": self.rates,
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_mode(
    client: Any, libs: list[str], mode: str, rounds: int, cycles: int, server_pid: int | None
) -> dict[str, Any]:
    samples = {lib: _Samples() for lib in libs}
    for lib in libs:  # warm-up: scripts loaded, watchdog thread started, imports done
        timed(
            make_cycle(client, lib, mode, f"bench:warm:{mode}:{lib}"), max(10, cycles // 10), None
        )
    for round_no in range(rounds):
        rate: dict[str, float] = {}
        cpu: dict[str, float | None] = {}
        for lib in rotated(libs, round_no):
            cycle = make_cycle(client, lib, mode, f"bench:u:{mode}:{lib}:{round_no}")
            run = functools.partial(_counted, cycle, cycles, server_pid)
            if lib == OURS:
                run = _then_flushed(run)
            flush_tallies()  # nothing of ours left to be written during a peer's block
            rate[lib], cpu[lib] = measured(client, samples[lib].redis, run)
            samples[lib].rates.append(rate[lib])
        for lib in libs:
            cycle_cpu, raw_cpu = cpu[lib], cpu.get(FLOOR)
            if cycle_cpu is not None:
                samples[lib].cpus.append(cycle_cpu)
            if FLOOR in rate:
                samples[lib].ratios.append(rate[lib] / rate[FLOOR])
                if cycle_cpu and raw_cpu:
                    samples[lib].cpu_ratios.append(raw_cpu / cycle_cpu)
    result = {lib: samples[lib].summary() for lib in libs}
    ratios(result, FLOOR)
    return result


def measure_uncontended(
    url: str, libs: list[str], rounds: int, cycles: int, server_pid: int | None = None
) -> dict[str, dict[str, Any]]:
    """``{mode: {lib: row}}`` for both modes, per use first."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return {
            mode: measure_mode(client, libs, mode, rounds, cycles, server_pid) for mode in MODES
        }
    finally:
        client.close()
