"""Command line and contended runs: ``python -m bench [--quick] [--json] [--libs ...]``.

Noise on shared machines is large, so libraries are measured in small blocks,
interleaved (the order rotates every round), repeated, and summarised by
medians and by ratios to the raw floor measured in the same rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import queue
import sys
import time
from typing import Any

from bench.libs import LIBRARIES
from bench.report import Thresholds, render, summarize_contended, targets
from bench.uncontended import measure_uncontended, rotated
from bench.workers import Command, setup_django, worker_main

DEFAULTS = {"rounds": 15, "cycles": 300, "processes": 8, "contended_rounds": 2, "duration": 1.0}
QUICK = {"rounds": 3, "cycles": 100, "processes": 8, "contended_rounds": 1, "duration": 0.3}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure django-redislock's Lock against redis-py, python-redis-lock, "
        "pottery and a raw SET NX PX loop, on one private redis-server, in one run.",
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds in all: a smoke test")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--libs",
        default=",".join(LIBRARIES),
        help=f"comma-separated libraries (default: all of {', '.join(LIBRARIES)})",
    )
    parser.add_argument(
        "--rounds", type=int, help="uncontended rounds (blocks per library and mode)"
    )
    parser.add_argument("--cycles", type=int, help="acquire+release cycles per uncontended block")
    parser.add_argument("--processes", type=int, help="competing processes in handoff runs")
    parser.add_argument("--contended-rounds", type=int, help="handoff rounds per library and mode")
    parser.add_argument("--duration", type=float, help="seconds per handoff run")
    parser.add_argument(
        "--skip-contended", action="store_true", help="only the uncontended measurement"
    )
    args = parser.parse_args(argv)
    libs = [name.strip() for name in args.libs.split(",") if name.strip()]
    unknown = [name for name in libs if name not in LIBRARIES]
    if unknown:
        parser.error(f"--libs: unknown {', '.join(unknown)}; choose from {', '.join(LIBRARIES)}")
    if not libs:
        parser.error("--libs: name at least one library")
    args.libs = libs
    base = QUICK if args.quick else DEFAULTS
    for option, default in base.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
        if getattr(args, option) <= 0:
            parser.error(f"--{option.replace('_', '-')} must be positive")
    if args.processes < 2:
        parser.error("--processes must be at least 2")
    return args


# --- contended ---------------------------------------------------------------------


def measure_contended(
    url: str, libs: list[str], processes: int, rounds: int, duration: float
) -> dict[str, Any]:
    libs = [lib for lib in libs if LIBRARIES[lib].contended]
    if not libs:
        return {}
    ctx = multiprocessing.get_context("spawn")
    holds = ctx.Value("q", 0, lock=False)
    results = ctx.Queue()
    queues = [ctx.SimpleQueue() for _ in range(processes)]
    workers = [
        ctx.Process(target=worker_main, args=(i, url, queues[i], results, holds), daemon=True)
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        lib: {"polite": [], "greedy": []} for lib in libs
    }
    try:
        for _ in workers:
            _get(results, workers, 120)
        for round_no in range(rounds):
            for lib in rotated(libs, round_no):
                for mode in ("polite", "greedy"):
                    start_at = time.monotonic() + 0.05
                    command = Command(
                        lib, mode, f"bench:c:{lib}:{mode}:{round_no}", start_at, start_at + duration
                    )
                    for commands in queues:
                        commands.put(command)
                    per_worker = [_get(results, workers, duration + 120) for _ in workers]
                    runs[lib][mode].append(
                        {
                            "end_ns": int(command.end_at * 1e9),
                            "records": [r[2] for r in sorted(per_worker, key=lambda r: r[1])],
                            "violations": sum(r[3] for r in per_worker),
                        }
                    )
    finally:
        for commands in queues:
            commands.put(None)
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join(5)
    return {lib: summarize_contended(runs[lib], processes) for lib in libs}


def _get(results: Any, workers: list[Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            dead = [w.pid for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"bench worker processes {dead} died") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench workers did not answer within {timeout:.0f}s") from None


# --- main -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.support.servers import REDIS_SERVER, SERVER_KIND, RedisServer

    if REDIS_SERVER is None:  # the bench starts its own; it never uses a shared one
        print(
            f"The bench needs a {SERVER_KIND}-server binary on PATH (it starts a private "
            f"one on a free port): install Redis (apt-get install redis-server).",
            file=sys.stderr,
        )
        return 2
    with RedisServer() as server:
        setup_django(server.url)
        redis_version = server.client().info("server")["redis_version"]
        began = time.monotonic()
        pid = server.process.pid if server.process is not None else None
        uncontended = measure_uncontended(server.url, args.libs, args.rounds, args.cycles, pid)
        contended = {}
        if not args.skip_contended:
            contended = measure_contended(
                server.url, args.libs, args.processes, args.contended_rounds, args.duration
            )
        elapsed = time.monotonic() - began
    data: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.system()}",
            "python": platform.python_version(),
            "redis": redis_version,
            "seconds": round(elapsed, 1),
            "options": {
                k: getattr(args, k)
                for k in ("rounds", "cycles", "processes", "contended_rounds", "duration")
            },
            "labels": {lib: LIBRARIES[lib].label for lib in args.libs},
        },
        "uncontended": uncontended,
        "contended": contended,
    }
    data["targets"] = targets(data, Thresholds())
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(data))
    violations = sum(c["violations"] for lib in contended.values() for c in lib.values())
    return 1 if violations else 0
