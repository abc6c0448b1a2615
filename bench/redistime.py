"""Redis time per cycle, from ``INFO commandstats`` deltas on the bench's own server.

The server times every command it runs (``usec`` per command name), scripts'
inner ``redis.call``s included, and an ``EVALSHA``'s (or ``EXEC``'s) own time
already contains the time of the commands it ran. So two sums are reported:

- **all**: ``usec`` summed over every command name, inner calls counted again
  on top of the script that ran them (the issue's "every command the server
  ran");
- **top**: the time of the commands the client sent (``EVALSHA``, ``SET``,
  ``BLPOP``, ``MULTI``/``EXEC``, ...), which is the server's time for the cycle
  counted once. A command name can be both sent and run inside a script (a
  plain ``SET`` beside a script that sets), so each name counts with the share
  of its calls that the client sent, counted client-side by wrapping
  ``Redis.execute_command`` and ``Pipeline.execute`` (the public methods
  tracers wrap) while a block runs.

The bench's own ``CONFIG RESETSTAT`` and ``INFO`` are left out of both.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: The bench's own bookkeeping commands, never part of a cycle.
OWN_COMMANDS = frozenset({"config", "info"})


def _base(name: Any) -> str:
    """The base command: ``b"EVALSHA"`` -> ``evalsha``, ``"config|resetstat"`` -> ``config``."""
    if isinstance(name, bytes):
        name = name.decode()
    return str(name).lower().replace("|", " ").split()[0]


@contextmanager
def count_sent() -> Iterator[collections.Counter[str]]:
    """Count, per command name, what redis-py sends while the block runs.

    Commands queued in a ``MULTI`` pipeline run inside ``EXEC`` on the server,
    so they count as ``multi`` and ``exec`` only.
    """
    import redis
    from redis.client import Pipeline

    sent: collections.Counter[str] = collections.Counter()
    execute_command = redis.Redis.execute_command
    execute = Pipeline.execute

    def counting_command(self: Any, *args: Any, **options: Any) -> Any:
        sent[_base(args[0])] += 1
        return execute_command(self, *args, **options)

    def counting_execute(self: Any, *args: Any, **options: Any) -> Any:
        if self.transaction:
            sent.update(("multi", "exec"))
        else:
            sent.update(_base(args[0]) for args, _ in self.command_stack)
        return execute(self, *args, **options)

    redis.Redis.execute_command = counting_command  # type: ignore[method-assign]
    Pipeline.execute = counting_execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
        Pipeline.execute = execute  # type: ignore[method-assign]


def reset(client: Any) -> None:
    """Zero the server's command statistics (``CONFIG RESETSTAT``)."""
    client.config_resetstat()


def server_stats(client: Any) -> dict[str, tuple[int, int]]:
    """``{command: (calls, usec)}`` since the last reset, subcommands folded in."""
    stats: dict[str, tuple[int, int]] = {}
    for key, value in client.info("commandstats").items():
        name = _base(key.removeprefix("cmdstat_"))
        if name in OWN_COMMANDS:
            continue
        calls, usec = stats.get(name, (0, 0))
        stats[name] = (calls + int(value["calls"]), usec + int(value["usec"]))
    return stats


@dataclass
class RedisTime:
    """Server µs accumulated over blocks, for one contender."""

    cycles: int = 0
    all_usec: float = 0.0
    top_usec: float = 0.0
    calls: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(
        self, stats: dict[str, tuple[int, int]], sent: collections.Counter[str], cycles: int
    ) -> None:
        self.cycles += cycles
        for name, (calls, usec) in stats.items():
            self.all_usec += usec
            self.calls[name] += calls
            if calls:
                self.top_usec += usec * min(1.0, sent[name] / calls)

    def per_cycle(self) -> dict[str, float | None]:
        if not self.cycles:
            return {"redis_us_all": None, "redis_us_top": None}
        return {
            "redis_us_all": self.all_usec / self.cycles,
            "redis_us_top": self.top_usec / self.cycles,
        }

    def commands_per_cycle(self) -> dict[str, float]:
        """Server-side calls per cycle by command name, scripts' inner calls included."""
        return {
            name: calls / self.cycles for name, calls in sorted(self.calls.items()) if self.cycles
        }


def measured(client: Any, into: RedisTime, run: Callable[[], tuple[T, int]]) -> T:
    """Run ``run()`` (returning a result and its cycle count) between a reset
    and a read of the server's statistics, which go ``into`` the contender's total."""
    reset(client)
    with count_sent() as sent:
        result, cycles = run()
    into.add(server_stats(client), sent, cycles)
    return result


def ratios(times: dict[str, dict[str, float | None]], floor: str) -> None:
    """Add ``redis_all_x_raw`` / ``redis_top_x_raw`` (contender / floor) to each row, in place."""
    base = times.get(floor, {})
    for row in times.values():
        for kind in ("all", "top"):
            value, raw = row.get(f"redis_us_{kind}"), base.get(f"redis_us_{kind}")
            row[f"redis_{kind}_x_raw"] = value / raw if value is not None and raw else None
