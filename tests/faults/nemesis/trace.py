"""The logs of a run, read back into operations and fault windows for the checker."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.nemesis import journal


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def overlaps(self, other: Window) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass
class FaultRecord:
    kind: str
    window: Window
    pid: int | None


@dataclass
class OpRecord:
    id: str
    worker: int
    pid: int
    kind: str
    res: tuple[str, ...]
    mode: str
    bt: float | None
    lease: float
    start: float
    #: The shortest lease it asked for (``extend()`` may set a shorter one).
    min_lease: float = math.inf
    renew: bool = True
    acq: float | None = None
    acq_ok: bool | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    writes: list[dict[str, Any]] = field(default_factory=list)
    rel: float | None = None
    end: float | None = None
    outcome: str | None = None
    err: str = ""
    lost_signal: bool = False
    killed_at: float | None = None
    last: float = 0.0

    @property
    def told(self) -> bool:
        return self.outcome == "lost" or self.lost_signal

    @property
    def hold_end(self) -> float | None:
        """When it stopped believing it held: it began to release, or was killed.
        ``None``: it never stopped (its worker vanished, a crash)."""
        if self.rel is not None:
            return self.rel
        if self.killed_at is not None:
            return max(self.killed_at, self.last)
        if self.outcome is not None:  # ended without releasing: a failed acquire
            return self.end
        return None

    def order_key(self, res: str) -> tuple[float, float]:
        """Grant order: the fencing token; no token (the naive lock) sorts first,
        by when the acquire returned."""
        token = self.tokens.get(res)
        return (-1.0 if token is None else float(token), self.acq or 0.0)

    def describe(self, res: str | None = None) -> str:
        token = f" token {self.tokens.get(res)}" if res in self.tokens else ""
        end = self.hold_end
        held = f" held {self.acq:.3f}-{end:.3f}" if self.acq_ok and self.acq and end else ""
        error = f": {self.err[:160]}" if self.err else ""
        return f"op {self.id} ({self.kind}{token}{held}, outcome {self.outcome}{error})"


@dataclass
class Trace:
    ops: dict[str, OpRecord] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    #: Slow PINGs through the proxy (``nemesis.Probe``): not faults, but Redis was slow.
    stalls: list[FaultRecord] = field(default_factory=list)

    def holds(self, resource: str) -> Iterator[OpRecord]:
        for op in self.ops.values():
            if op.acq_ok and resource in op.res:
                yield op

    def stopped(self, pid: int, window: Window) -> bool:
        return any(
            f.kind == "pause_holder" and f.pid == pid and f.window.overlaps(window)
            for f in self.faults
        )

    def faults_in(self, window: Window) -> list[FaultRecord]:
        """The faults, and the stalls, that overlap ``window``."""
        return [f for f in [*self.faults, *self.stalls] if f.window.overlaps(window)]


def load(log_dir: Path) -> Trace:
    trace = Trace()
    kills = _read_nemesis(log_dir / "nemesis.log", trace)
    for path in sorted(log_dir.glob("worker-*.log")):
        _read_worker(path, trace, kills)
    return trace


def _read_nemesis(path: Path, trace: Trace) -> dict[int, float]:
    """Fault windows (a ``fault`` line to its ``healed`` line) and kill times by pid."""
    kills: dict[int, float] = {}
    open_faults: dict[str, dict[str, Any]] = {}  # by the id pairing a fault and its healing
    for line in journal.read(path):
        key = str(line.get("n", line.get("kind")))
        if line["ev"] == "fault":
            open_faults[key] = line
            if line["kind"] == "kill_holder":
                kills[line["pid"]] = line["t"]
        elif line["ev"] == "healed" and key in open_faults:
            began = open_faults.pop(key)
            window = Window(began["t"], line["t"])
            trace.faults.append(FaultRecord(began["kind"], window, began.get("pid")))
        elif line["ev"] in ("crash", "nemesis-error"):
            trace.crashes.append(str(line))
        elif line["ev"] == "stall":
            window = Window(line["since"], line["since"] + line["took"])
            trace.stalls.append(FaultRecord("stall", window, None))
        elif line["ev"] == "cleanup-kill":
            kills[line["pid"]] = line["t"]
    for began in open_faults.values():  # never healed: the run ended first
        window = Window(began["t"], math.inf)
        trace.faults.append(FaultRecord(began["kind"], window, began.get("pid")))
    return kills


def _read_worker(path: Path, trace: Trace, kills: dict[int, float]) -> None:
    pid, worker = 0, 0
    ops: list[OpRecord] = []
    for line in journal.read(path):
        ev, t = line["ev"], line["t"]
        if ev == "hello":
            pid, worker = line["pid"], line["w"]
            continue
        if ev == "lost":
            _attribute_lost(ops, line)
            continue
        if ev == "start":
            op = OpRecord(
                line["op"], worker, pid, line["kind"], tuple(line["res"]), line["mode"],
                line["bt"], line["lease"], t, line["lease"], line["renew"],
            )  # fmt: skip
            ops.append(op)
            trace.ops[op.id] = op
        op = trace.ops.get(line.get("op", ""))
        if op is None:
            continue
        op.last = t
        if ev == "acq":
            op.acq, op.acq_ok = t, line["ok"]
        elif ev == "token" and line["token"] is not None:
            op.tokens[line["res"]] = line["token"]
        elif ev == "write":
            op.writes.append(line)
        elif ev == "extended":
            op.min_lease = min(op.min_lease, line["lease"])
        elif ev == "rel":
            op.rel = t
        elif ev == "end":
            op.end, op.outcome, op.err = t, line["outcome"], line.get("err", "")
    killed = kills.get(pid)
    for op in ops:
        if op.outcome is None:
            if killed is None:
                trace.crashes.append(f"op {op.id} never ended and worker {worker} was not killed")
            else:
                op.killed_at = killed


def _attribute_lost(ops: list[OpRecord], line: dict[str, Any]) -> None:
    """A ``lock_lost`` belongs to the hold of that name that began ``held``
    seconds before it was sent: the latest such operation of this worker."""
    began = line["t"] - float(line.get("held") or 0.0) + 0.25
    for op in reversed(ops):
        if line["name"] in op.res and op.acq_ok is not False and op.start <= began:
            op.lost_signal = True
            return
