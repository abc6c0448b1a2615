"""The contended runs: N spawned processes take turns on one name.

Each worker records ``(acquired_ns, releasing_ns)`` per hold on the system-wide
monotonic clock (comparable across processes on one machine). Inside the
critical section it bumps a Redis gauge of current holders (anything but 1 is
a mutual-exclusion violation) and a shared hold counter, which a "polite"
releaser watches so that it competes again only once another process holds
the lock: every gap it leaves is then the wake-up latency of a process that
was already waiting.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

#: How often a polite releaser looks whether someone else has the lock. Harness
#: only; the libraries wait however they wait.
POLITE_POLL = 0.0002


@dataclass(frozen=True)
class Command:
    lib: str
    mode: str  # "polite" or "greedy"
    name: str
    start_at: float  # time.monotonic() in every process
    end_at: float


def setup_django(url: str) -> None:
    """Point ``bench.settings``' default cache at the private server at ``url``
    and set Django up: the coordinator, every worker and the probes alike."""
    os.environ["REDISLOCK_BENCH_REDIS_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()


def worker_main(
    index: int, url: str, commands: Any, results: Any, holds: Any
) -> None:  # pragma: no cover - runs in a spawned process
    setup_django(url)
    import redis

    from bench.libs import LIBRARIES

    client = redis.Redis.from_url(url)
    gauge_client = redis.Redis.from_url(url)
    results.put(("ready", index, None, 0))
    while True:
        command: Command | None = commands.get()
        if command is None:
            return
        acquire, release = LIBRARIES[command.lib].make(client, command.name)
        gauge = command.name + ":gauge"
        polite = command.mode == "polite"
        records: list[tuple[int, int]] = []
        violations = 0
        while (delay := command.start_at - time.monotonic()) > 0:
            time.sleep(min(delay, 0.05))
        while time.monotonic() < command.end_at:
            acquire()
            acquired = time.monotonic_ns()
            if gauge_client.incr(gauge) != 1:
                violations += 1
            count = holds.value + 1
            holds.value = count
            gauge_client.decr(gauge)
            releasing = time.monotonic_ns()
            release()
            records.append((acquired, releasing))
            if polite:
                while holds.value == count and time.monotonic() < command.end_at:
                    time.sleep(POLITE_POLL)
        results.put(("done", index, records, violations))
