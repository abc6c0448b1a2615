"""Client instructions per uncontended cycle, counted by callgrind (not timed).

    python -m bench.instructions                    raw, redis-py's Lock, Lock
    python -m bench.instructions --libs redislock   one library
    python -m bench.instructions --asyncio          redis.asyncio's Lock, AsyncLock

Each library runs in a process of its own under
``valgrind --tool=callgrind --separate-threads=yes``, twice: ``LOW`` and
``HIGH`` cycles of ``with <lock>: pass``, a new lock object per cycle, the
default options, on a private ``redis-server``. The count per cycle is
``(I(HIGH) - I(LOW)) / (HIGH - LOW)`` of the thread that runs the cycles,
so start-up (Python, Django, the first connection) cancels out. Background
threads (the watchdog, the counters' writer) work per second, not per cycle,
and are reported apart. An instruction count is the same for the same code
however loaded the machine is, which a wall-clock time on a shared 2-core box
is not.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOW, HIGH = 200, 700
WARM_UP = 50
LIBS = ("raw", "redispy", "redislock")
#: ``--asyncio``: every cycle awaited in one event loop (``asyncio.run`` once).
ASYNC_LIBS = ("aio-redispy", "aio-redislock")


def child(lib: str, cycles: int, url: str) -> None:  # pragma: no cover - under valgrind
    sys.path.insert(0, str(ROOT))
    from bench.workers import setup_django

    setup_django(url)
    if lib.startswith("aio-"):
        _child_async(lib, cycles, url)
        return
    import redis

    client = redis.Redis.from_url(url)
    if lib == "raw":
        release = client.register_script(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"
        )

        def cycle() -> None:
            client.set("raw", "token", nx=True, px=30000)
            release(keys=["raw"], args=["token"])

    elif lib == "redispy":

        def cycle() -> None:
            with client.lock("redispy", timeout=30, blocking_timeout=5):
                pass

    else:
        from django_redislock import Lock

        def cycle() -> None:
            with Lock("redislock"):
                pass

    for _ in range(WARM_UP + cycles):
        cycle()


def _child_async(lib: str, cycles: int, url: str) -> None:  # pragma: no cover - under valgrind
    import asyncio

    import redis.asyncio

    async def main() -> None:
        if lib == "aio-redispy":
            client = redis.asyncio.Redis.from_url(url)

            async def cycle() -> None:
                async with client.lock("aio-redispy", timeout=30, blocking_timeout=5):
                    pass

        else:
            from django_redislock import AsyncLock

            async def cycle() -> None:
                async with AsyncLock("aio-redislock"):
                    pass

        for _ in range(WARM_UP + cycles):
            await cycle()

    asyncio.run(main())


def _count(out_dir: str) -> tuple[int, int]:
    """(the main thread's instructions, every other thread's) of one run."""
    main = others = 0
    for path in glob.glob(os.path.join(out_dir, "callgrind.out.*")):
        text = Path(path).read_text(errors="replace")
        found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
        count = int(found.group(1)) if found else 0
        if path.endswith("-01"):
            main += count
        else:
            others += count
    return main, others


def measure(lib: str, cycles: int, url: str) -> tuple[int, int]:
    out_dir = tempfile.mkdtemp(prefix="callgrind-")
    try:
        command = [
            "valgrind", "--tool=callgrind", "--separate-threads=yes",
            f"--callgrind-out-file={out_dir}/callgrind.out.%p",
            sys.executable, "-m", "bench.instructions", "--child", lib, str(cycles), url,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=1800)
        return _count(out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--libs", default=",".join(LIBS), help="comma-separated: raw, redispy, redislock"
    )
    parser.add_argument(
        "--asyncio", action="store_true", help="redis.asyncio's Lock against AsyncLock"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        lib, cycles, url = args.child
        child(lib, int(cycles), url)
        return 0
    if shutil.which("valgrind") is None:
        print("needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.support.servers import RedisServer

    rows = {}
    libs = ASYNC_LIBS if args.asyncio else args.libs.split(",")
    with RedisServer() as server:
        for lib in libs:
            low_main, low_others = measure(lib, LOW, server.url)
            high_main, high_others = measure(lib, HIGH, server.url)
            rows[lib] = {
                "per_cycle": (high_main - low_main) // (HIGH - LOW),
                "background_per_cycle": (high_others - low_others) // (HIGH - LOW),
            }
            if not args.json:
                row = rows[lib]
                line = f"{lib:<13} {row['per_cycle']:>9,} instructions per cycle"
                print(f"{line} (background threads {row['background_per_cycle']:,})", flush=True)
    if "redislock" in rows and "redispy" in rows and not args.json:
        ratio = rows["redislock"]["per_cycle"] / rows["redispy"]["per_cycle"]
        print(f"Lock / redis-py Lock: {ratio:.3f}x (target <= 1.03x)")
    if "aio-redislock" in rows and "aio-redispy" in rows and not args.json:
        ratio = rows["aio-redislock"]["per_cycle"] / rows["aio-redispy"]["per_cycle"]
        print(f"AsyncLock / redis.asyncio Lock: {ratio:.3f}x (target <= 1.03x)")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
