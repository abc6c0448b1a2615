"""Run the nemesis from a shell, for as long as you like::

    .venv/bin/python -m tests.faults.nemesis --minutes 30 --seed 7

PostgreSQL when ``DATABASE_URL`` is set (a database of its own is created and
dropped), SQLite otherwise. Prints the summary line and every violation;
exits 1 when there is one, with the command that replays the seed. SIGINT
(Ctrl-C) or SIGTERM ends the faults early and checks what ran.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.nemesis", description=__doc__)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long the faults go on (default 2)")
    length.add_argument("--seconds", type=float, help="the same, in seconds")
    parser.add_argument("--seed", type=int, help="the schedule's seed (default: a random one)")
    parser.add_argument("--workers", type=int, default=6, help="worker processes (default 6)")
    parser.add_argument(
        "--sabotage", action="store_true", help="use a naive lock: the checker must fail"
    )
    parser.add_argument("--log-dir", type=Path, help="where the logs go (default: a temp dir)")
    parser.add_argument(
        "--check",
        type=Path,
        metavar="LOG_DIR",
        help="run nothing: check the logs an earlier run left in LOG_DIR again",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 2.0)
    if seconds < 5:
        parser.error(f"a run must last at least 5 seconds, not {seconds:g}")
    if args.workers < 2:
        parser.error(f"--workers must be at least 2, not {args.workers}")
    args.seconds = seconds
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ.setdefault("REDISLOCK_TEST_DATABASE", f"test_redislock_nemesis_{os.getpid()}")
    import django

    django.setup()
    from tests.faults.nemesis.run import Config, recheck, run

    config = Config(args.seed, args.seconds, args.workers, args.sabotage, args.log_dir)
    report = recheck(args.check) if args.check is not None else _run(config, run)
    print(report.summary())
    print("holds by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(report.kinds.items())))
    for line in report.details():
        print(f"  {line}")
    print(f"logs: {report.log_dir}")
    if report.violations:
        print(f"FAILED; replay with: {report.replay or config.replay()}")
        return 1
    return 0


def _run(config: Any, run: Any) -> Any:
    from django.test.utils import setup_databases, teardown_databases

    print(f"nemesis: seed {config.seed}, {config.seconds:g} s, replay: {config.replay()}")
    interrupted = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        print(f"nemesis: {signal.Signals(signum).name}: stopping the faults, checking what ran")
        interrupted.set()

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    databases = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        return run(config, interrupted)
    finally:
        teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
