"""What a nemesis run does, derived from one seed.

The seed fixes the fault schedule (which fault, when, for how long, aimed at
which holder) and each worker's sequence of operations (which primitive, which
options, how long it works inside its section). Timing on a real machine still
varies from run to run, so a replay repeats the same decisions, not the same
interleaving; a failure found with a seed usually comes back with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Resources (register rows) and how many holders each admits at once. Operations
#: of one resource share a fencing-token sequence (one lock name).
CAPACITY = {"lock": 1, "sem": 2, "rw": 1, "m.a": 1, "m.b": 1, "m.c": 1, "red": 1}
RESOURCES = tuple(CAPACITY)

#: Operation kinds a worker draws from, with weights.
OP_WEIGHTS = {
    "lock": 3,  # Lock, plain
    "lock_nested": 2,  # Lock, acquired again inside its own section
    "lock_extend": 2,  # Lock, extend() with a new lease mid-section
    "alock": 2,  # AsyncLock on the same name as Lock
    "sem": 2,  # Semaphore (limit 2)
    "asem": 2,  # AsyncSemaphore on the same name
    "rw_read": 2,  # ReadWriteLock.read(): reads the register only
    "rw_write": 2,  # ReadWriteLock.write()
    "multi": 2,  # MultiLock over two of m.a, m.b, m.c
    "redlock": 2,  # Redlock on three servers
}

#: Fault kinds the nemesis draws from, with weights.
FAULT_WEIGHTS = {
    "pause_holder": 3,  # SIGSTOP a worker (a holder when one is), SIGCONT later
    "kill_holder": 1.5,  # SIGKILL a worker; the runner starts a new one
    "restart_redis": 1,  # SIGKILL redis-server, start it again from its AOF
    "pause_redis": 1,  # SIGSTOP redis-server, SIGCONT later
    "partition": 1.5,  # the proxy black-holes every connection
    "slow": 1.5,  # the proxy delays every chunk
    "reset": 1.5,  # the proxy resets every open connection
    "redlock_pause": 1,  # SIGSTOP one or two of the three Redlock servers
    "redlock_restart": 1,  # SIGKILL one Redlock server, start it from its AOF
}

#: The nemesis's two tracks of faults, applied at the same time.
TRACKS = {
    "holders": ("pause_holder", "kill_holder"),
    "servers": tuple(kind for kind in FAULT_WEIGHTS if not kind.endswith("_holder")),
}

#: Socket timeouts of the workers' caches (what production sites commonly set).
SOCKET_TIMEOUT = 0.5
#: How far past ``blocking_timeout`` an acquire may end (docs/api.md).
BOUND_SLACK = 0.5


@dataclass(frozen=True)
class Fault:
    """One fault: starts ``at`` seconds into the run and lasts ``duration``."""

    at: float
    kind: str
    duration: float
    #: In [0, 1): which target, among those present when the fault fires.
    pick: float
    #: Kind-specific: the proxy's per-chunk delay, how many Redlock servers.
    param: float


@dataclass(frozen=True)
class OpPlan:
    """One worker operation."""

    kind: str
    lease: float
    blocking_timeout: float
    auto_renew: bool
    #: Seconds of work before reading and between reading and writing.
    work: tuple[float, float]
    #: ``extend()``'s new lease; MultiLock's names.
    new_lease: float
    names: tuple[str, ...]


def faults(seed: int, seconds: float) -> dict[str, list[Fault]]:
    """The fault schedule of a run of ``seconds``, as two tracks that run at
    once: one aimed at the holders, one at the servers and the network (so a
    holder resuming from a pause may meet a partition). Within a track one
    fault at a time, with quiet gaps so that holders also get through."""
    return {
        track: _track(random.Random(f"nemesis:{seed}:{track}"), kinds, seconds)
        for track, kinds in TRACKS.items()
    }


def _track(rng: random.Random, kinds: tuple[str, ...], seconds: float) -> list[Fault]:
    weights = [FAULT_WEIGHTS[kind] for kind in kinds]
    schedule: list[Fault] = []
    at = rng.uniform(1.0, 2.0)
    while at < seconds - 1.0:
        kind = rng.choices(kinds, weights)[0]
        duration = _duration(rng, kind)
        param = rng.uniform(0.02, 0.2) if kind == "slow" else float(rng.randint(1, 2))
        schedule.append(Fault(round(at, 3), kind, duration, rng.random(), round(param, 3)))
        at += duration + rng.uniform(1.0, 4.0)
    return schedule


def _duration(rng: random.Random, kind: str) -> float:
    if kind in ("kill_holder", "reset"):
        return 0.0
    if kind in ("restart_redis", "redlock_restart"):
        return round(rng.uniform(0.0, 1.5), 3)  # down time before it starts again
    return round(rng.uniform(0.3, 3.0), 3)


def worker_rng(seed: int, worker: int) -> random.Random:
    return random.Random(f"worker:{seed}:{worker}")


def next_op(rng: random.Random, *, sabotage: bool) -> OpPlan:
    """The next operation of a worker. In sabotage mode every operation is the
    naive lock's (its lease fixed and sometimes shorter than the work)."""
    kinds, weights = zip(*OP_WEIGHTS.items(), strict=True)
    kind = rng.choices(kinds, weights)[0]
    names = tuple(sorted(rng.sample(["m.a", "m.b", "m.c"], 2)))
    if sabotage:
        kind = "naive"
    return OpPlan(
        kind=kind,
        lease=round(rng.uniform(0.8, 2.0), 3),
        blocking_timeout=round(rng.uniform(1.0, 3.0), 3),
        auto_renew=rng.random() < 0.5,
        work=(round(rng.uniform(0.0, 0.2), 3), round(rng.uniform(0.0, 0.3), 3)),
        new_lease=round(rng.uniform(1.0, 2.5), 3),
        names=names,
    )
