"""Waiting at scale: many waiters per process, the cache pool at its default size.

    python -m bench.waiters            every case below, one private redis-server
    python -m bench.waiters --quick    a short run of each (a smoke test)
    python -m bench.waiters --json     the rows as JSON

Each case runs in a process of its own, as a site's worker would: N threads
(or N asyncio tasks on one loop) each loop ``with Lock(name,
blocking_timeout=5): sleep(0.02)`` for ``--seconds``, a new ``Lock`` per
use, over one name or spread over 50, through a django-redis cache with
``SOCKET_TIMEOUT`` 5 s or 0.5 s and its default pool (redis-py 8: 100
connections). redis-py's own ``Lock`` (``client.lock(...)``, its default
0.1 s sleep-poll) runs the same load on the same kind of cache client.

Per case: the process's peak connections to Redis (``INFO clients``,
sampled every 20 ms, this probe's own connection left out), acquisitions,
timeouts, backend errors, and the longest wait. A fair lock has no timeout
while a queue's length times the hold fits in the budget (120 threads on one
name: 2.4 s of queue in a 5 s budget; 1,000 over 50 names: 0.4 s); 1,000 on
one name (20 s of queue) must time out, but without an error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOLD = 0.02
BUDGET = 5.0

#: (label, threads or tasks, names, async)
LOADS = [
    ("120 threads, 1 name", 120, 1, False),
    ("1,000 threads, 1 name", 1000, 1, False),
    ("1,000 threads, 50 names", 1000, 50, False),
    ("1,000 tasks, 1 name", 1000, 1, True),
    ("1,000 tasks, 50 names", 1000, 50, True),
]
SOCKET_TIMEOUTS = (5.0, 0.5)


@dataclass
class Row:
    load: str
    lib: str
    socket_timeout: float
    peak_connections: int
    pool_cap: int
    acquired: int
    timeouts: int
    errors: int
    max_wait: float
    first_error: str


def _settings(url: str, socket_timeout: float) -> None:
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_redislock"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.DefaultClient",
                    "SOCKET_TIMEOUT": socket_timeout,
                    "SOCKET_CONNECT_TIMEOUT": socket_timeout,
                },
            }
        },
    )
    import django

    django.setup()


class _Tally:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.acquired = self.timeouts = self.errors = 0
        self.max_wait = 0.0
        self.first_error = ""

    def add(self, outcome: str, waited: float, error: str = "") -> None:
        with self.mutex:
            if outcome == "acquired":
                self.acquired += 1
            elif outcome == "timeout":
                self.timeouts += 1
            else:
                self.errors += 1
                self.first_error = self.first_error or error
            self.max_wait = max(self.max_wait, waited)


def _sync_load(lib: str, threads: int, names: int, seconds: float, tally: _Tally) -> None:
    from django_redis import get_redis_connection

    from django_redislock import Lock, LockBackendError, LockTimeout

    client = get_redis_connection("default")
    stop = time.monotonic() + seconds
    start = threading.Barrier(threads)

    def ours(name: str) -> None:
        began = time.monotonic()
        try:
            with Lock(name, blocking_timeout=BUDGET):
                tally.add("acquired", time.monotonic() - began)
                time.sleep(HOLD)
        except LockBackendError as exc:
            tally.add("error", time.monotonic() - began, f"{type(exc).__name__}: {exc}")
        except LockTimeout:
            tally.add("timeout", time.monotonic() - began)

    def redis_py(name: str) -> None:
        import redis

        began = time.monotonic()
        lock = client.lock(f"bench:{name}", timeout=30, blocking_timeout=BUDGET)
        try:
            if lock.acquire():
                tally.add("acquired", time.monotonic() - began)
                time.sleep(HOLD)
                lock.release()
            else:
                tally.add("timeout", time.monotonic() - began)
        except redis.RedisError as exc:
            tally.add("error", time.monotonic() - began, f"{type(exc).__name__}: {exc}")

    cycle = ours if lib == "django-redislock" else redis_py

    def loop(index: int) -> None:
        start.wait()
        name = f"waiters:{index % names}"
        while time.monotonic() < stop:
            cycle(name)

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(seconds + BUDGET + 30)


def _async_load(lib: str, tasks: int, names: int, seconds: float, tally: _Tally) -> None:
    import asyncio

    from django_redislock import AsyncLock, LockBackendError, LockTimeout

    async def main() -> None:
        import redis
        import redis.asyncio
        from django_redis import get_redis_connection

        kwargs = get_redis_connection("default").connection_pool.connection_kwargs
        peer = redis.asyncio.Redis(
            host=kwargs["host"], port=kwargs["port"], socket_timeout=kwargs["socket_timeout"]
        )
        stop = time.monotonic() + seconds

        async def ours(name: str) -> None:
            began = time.monotonic()
            try:
                async with AsyncLock(name, blocking_timeout=BUDGET):
                    tally.add("acquired", time.monotonic() - began)
                    await asyncio.sleep(HOLD)
            except LockBackendError as exc:
                tally.add("error", time.monotonic() - began, f"{type(exc).__name__}: {exc}")
            except LockTimeout:
                tally.add("timeout", time.monotonic() - began)

        async def redis_py(name: str) -> None:
            began = time.monotonic()
            lock = peer.lock(f"bench:{name}", timeout=30, blocking_timeout=BUDGET)
            try:
                if await lock.acquire():
                    tally.add("acquired", time.monotonic() - began)
                    await asyncio.sleep(HOLD)
                    await lock.release()
                else:
                    tally.add("timeout", time.monotonic() - began)
            except redis.RedisError as exc:
                tally.add("error", time.monotonic() - began, f"{type(exc).__name__}: {exc}")

        cycle = ours if lib == "django-redislock" else redis_py

        async def loop(index: int) -> None:
            name = f"waiters:{index % names}"
            while time.monotonic() < stop:
                await cycle(name)

        await asyncio.gather(*(loop(i) for i in range(tasks)))

    asyncio.run(main())


def child(args: argparse.Namespace) -> None:  # pragma: no cover - its own process
    sys.path.insert(0, str(ROOT))
    _settings(args.url, args.socket_timeout)
    tally = _Tally()
    load = _async_load if args.tasks else _sync_load
    load(args.lib, args.count, args.names, args.seconds, tally)
    from django_redis import get_redis_connection

    cap = get_redis_connection("default").connection_pool.max_connections
    print(
        json.dumps(
            {
                "acquired": tally.acquired,
                "timeouts": tally.timeouts,
                "errors": tally.errors,
                "max_wait": round(tally.max_wait, 2),
                "first_error": tally.first_error[:200],
                "pool_cap": cap,
            }
        )
    )


def _peak(client: Any, done: threading.Event) -> list[int]:
    peak = [0]
    while not done.wait(0.02):
        peak[0] = max(peak[0], int(client.info("clients")["connected_clients"]) - 1)
    return peak


def run_case(url: str, load: tuple[str, int, int, bool], lib: str, socket_timeout: float,
             seconds: float) -> Row:  # fmt: skip
    import redis

    label, count, names, is_async = load
    probe = redis.Redis.from_url(url)
    probe.flushall()
    done = threading.Event()
    peak: list[int] = [0]
    sampler = threading.Thread(target=lambda: peak.__setitem__(0, _peak(probe, done)[0]))
    sampler.start()
    command = [
        sys.executable, "-m", "bench.waiters", "--child", "--url", url, "--lib", lib,
        "--count", str(count), "--names", str(names), "--seconds", str(seconds),
        "--socket-timeout", str(socket_timeout),
    ]  # fmt: skip
    if is_async:
        command.append("--tasks")
    try:
        out = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120, check=True
        ).stdout
    finally:
        done.set()
        sampler.join()
    result = json.loads(out.strip().splitlines()[-1])
    return Row(label, lib, socket_timeout, peak[0], **result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help="a Redis to use (default: a private redis-server)")
    parser.add_argument("--lib", default="django-redislock", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--names", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--tasks", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--socket-timeout", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each case")
    parser.add_argument("--quick", action="store_true", help="2 s per case, ours only")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--only", help="run the loads whose label contains this text")
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.quick:
        args.seconds = 2.0
    libs = ["django-redislock"] if args.quick else ["django-redislock", "redis-py"]
    sys.path.insert(0, str(ROOT))
    from tests.support.servers import RedisServer

    rows: list[Row] = []
    with RedisServer() as server:
        url = args.url or server.url
        for load in LOADS:
            if args.only and args.only not in load[0]:
                continue
            for socket_timeout in SOCKET_TIMEOUTS:
                for lib in libs:
                    row = run_case(url, load, lib, socket_timeout, args.seconds)
                    rows.append(row)
                    if not args.json:
                        print(_line(row), flush=True)
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    return 1 if any(r.errors for r in rows if r.lib == "django-redislock") else 0


def _line(row: Row) -> str:
    return (
        f"{row.load:<24} {row.lib:<17} socket {row.socket_timeout:>3g} s: "
        f"peak {row.peak_connections:>4} conns (cap {row.pool_cap}), "
        f"{row.acquired:>5} acquired, {row.timeouts:>4} timeouts, {row.errors:>5} errors, "
        f"max wait {row.max_wait:.2f} s"
        + (f"  [{row.first_error[:90]}]" if row.first_error else "")
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
