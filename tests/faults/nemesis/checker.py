"""The checker: reads the workers' and the nemesis's logs and the database's
record of applied writes, counts what happened, and lists every violation.

Violations (each names the operations involved):

- ``exclusion``: two holders of one resource held it at once (more than its
  capacity; a reader and a writer of ``rw``), the newer granted before the
  stale one's lease (the lower fencing token's) could have ended (known for
  ``Lock`` kinds without the watchdog only: see ``_judge``);
- ``overlap``: the same, later in the stale one's lease, and the stale one
  was never told it lost its lease (unless it was killed before it could be);
- ``unreported``: a holder's write was refused because a newer token had
  written, so its lease had gone while it held, and it was never told;
- ``lost-update``: the applied writes of a register are not exactly
  ``1..N`` once each, the row does not hold ``N``, a write reported accepted
  is not in the database or one reported refused is;
- ``token-order``: a holder released before another began to acquire, yet
  got a token not below the other's; or the applied writes' tokens do not rise;
- ``bound``: an acquire ended later than ``blocking_timeout`` + 0.5 s after
  it began, while its process was not stopped;
- ``crash``: a worker died without the nemesis killing it, or the nemesis failed.

"Told" means: a ``LockLostError`` from any step of the operation, or a
``lock_lost`` signal for its hold. A violation that matches a defect already
filed is tagged with it (``Violation.known``) but still reported.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.nemesis.schedule import BOUND_SLACK, CAPACITY
from tests.faults.nemesis.trace import OpRecord, Trace, Window, load

#: Faults of Redis or the network, and the probe's stalls (a slow PING with no
#: fault to explain it): an acquire overrunning its bound during one is issue 31 item 2.
SERVER_FAULTS = frozenset(
    {"restart_redis", "pause_redis", "partition", "slow", "reset", "redlock_pause"}
    | {"redlock_restart", "stall"}
)
#: The ``Lock`` kinds, whose acquire without the watchdog sets the full lease.
FULL_LEASE_KINDS = frozenset({"lock", "lock_nested", "lock_extend", "alock", "multi"})
KNOWN_RELEASE = "issue 31 item 1: a failed release of a lease already over is not told"
KNOWN_BOUND = "issue 31 item 2: an acquire on a faulty or slow Redis overruns its bound"


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    known: str = ""

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}" + (f" [known: {self.known}]" if self.known else "")


@dataclass
class Report:
    seed: int
    seconds: float
    workers: int
    database: str
    log_dir: Path | None = None
    replay: str = ""
    counts: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    #: Operations that got their hold, by kind.
    kinds: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def only_known(self) -> bool:
        return bool(self.violations) and all(v.known for v in self.violations)

    def summary(self) -> str:
        c = self.counts
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items()))
        return (
            f"nemesis seed={self.seed} {self.seconds / 60:.1f} min, {self.workers} workers, "
            f"{self.database}: {c['ops']} ops ({c['held']} held, {c['timeouts']} timed out, "
            f"{c['backend']} backend errors), {c['writes']} writes, "
            f"{sum(self.faults.values())} faults ({faults}), {c['told']} losses reported, "
            f"{c['refused-fence'] + c['refused-value']} stale writes refused "
            f"({c['refused-fence']} by the fence, {c['refused-value']} by the value read), "
            f"{c['refused-shared']} semaphore writes refused; {len(self.violations)} violations"
            + self._breakdown()
        )

    def _breakdown(self) -> str:
        if not self.violations:
            return ""
        checks = Counter(v.check for v in self.violations)
        known = sum(1 for v in self.violations if v.known)
        return f" ({', '.join(f'{k} {n}' for k, n in sorted(checks.items()))}; {known} known)"

    def details(self, per_check: int = 10) -> list[str]:
        """The violations, at most ``per_check`` of each check, for a message."""
        shown: Counter[str] = Counter()
        lines = []
        for violation in self.violations:
            shown[violation.check] += 1
            if shown[violation.check] <= per_check:
                lines.append(str(violation))
        hidden = len(self.violations) - len(lines)
        return lines + ([f"... and {hidden} more"] if hidden else [])


def check(
    log_dir: Path,
    history: list[dict[str, Any]],
    registers: dict[str, int],
    report: Report,
) -> Report:
    """Fill ``report`` from the logs in ``log_dir`` and the database's ``history``
    (``NemesisWrite`` rows in id order) and final ``registers`` values."""
    trace = load(log_dir)
    _count(trace, report)
    found = report.violations
    found += [Violation("crash", line) for line in trace.crashes]
    for resource in CAPACITY:
        found += _overlaps(trace, resource)
        found += _grant_order(trace, resource)
    found += _unreported(trace)
    found += _lost_updates(trace, history, registers)
    found += _bounds(trace)
    return report


def _count(trace: Trace, report: Report) -> None:
    c = report.counts
    for op in trace.ops.values():
        c["ops"] += 1
        c["held"] += op.acq_ok is True
        report.kinds[op.kind] += op.acq_ok is True
        c["timeouts"] += op.outcome == "timeout"
        c["backend"] += op.outcome == "backend"
        c["told"] += op.told
        c["writes"] += sum(1 for w in op.writes if w["outcome"] == "ok")
        for write in op.writes:
            if write["outcome"].startswith("refused"):
                exclusive = CAPACITY[write["res"]] == 1
                c[write["outcome"] if exclusive else "refused-shared"] += 1
        c["db-errors"] += sum(1 for w in op.writes if w["outcome"] == "db-error")
    report.faults.update(fault.kind for fault in trace.faults)


def _overlaps(trace: Trace, resource: str) -> list[Violation]:
    """Sweep the holds of ``resource`` by the moment they began; wherever more
    holders than its capacity overlap, judge every stale one (``_judge``)."""
    holds = sorted(trace.holds(resource), key=lambda op: op.acq or 0.0)
    capacity = CAPACITY[resource]
    active: list[OpRecord] = []
    found: list[Violation] = []
    judged: set[str] = set()
    for op in holds:
        assert op.acq is not None
        active = [a for a in active if (a.hold_end or math.inf) > op.acq]
        rivals = [a for a in active if a.mode == "w" or op.mode == "w"]
        if len(rivals) + 1 > capacity:
            ranked = sorted([*rivals, op], key=lambda h: h.order_key(resource))
            for stale in ranked[: len(ranked) - capacity]:
                if stale.id not in judged:
                    judged.add(stale.id)
                    found += _judge(resource, stale, ranked[-1])
        active.append(op)
    return found


def _judge(resource: str, stale: OpRecord, newer: OpRecord) -> list[Violation]:
    """``newer`` was granted while ``stale`` still believed it held.

    If that was before ``stale``'s lease could have ended, Redis let two
    holders in: ``exclusion``, told or not. That is known only for a lock
    without the watchdog, whose acquire sets the full lease before it returns
    (with the watchdog, a hand-off's first lease is a short one that the
    watchdog then renews): its lease began no earlier than its acquire, and
    lasted at least its shortest lease. Otherwise ``stale``'s lease had ended
    and it must have been told by the end of its operation; one killed before
    its operation ended never got the chance, and is not blamed."""
    assert newer.acq is not None
    pair = f"{resource}: {stale.describe(resource)} still held when {newer.describe(resource)}"
    full_lease = not stale.renew and stale.kind in FULL_LEASE_KINDS
    if full_lease and newer.acq < stale.start + stale.min_lease:
        return [Violation("exclusion", f"{pair} was granted, before its lease could end")]
    if stale.told or stale.outcome is None:
        return []
    known = KNOWN_RELEASE if stale.outcome == "backend" else ""
    return [Violation("overlap", f"{pair} was granted, and was never told", known)]


def _grant_order(trace: Trace, resource: str) -> list[Violation]:
    """A hold released before another's acquire began has the lower token."""
    holds = [op for op in trace.holds(resource) if op.tokens.get(resource) is not None]
    ended = sorted((op for op in holds if op.end is not None), key=lambda op: op.end or 0.0)
    found: list[Violation] = []
    best: Any = None
    index = 0
    for op in sorted(holds, key=lambda op: op.start):
        while index < len(ended) and (ended[index].end or 0.0) < op.start:
            if best is None or ended[index].tokens[resource] > best.tokens[resource]:
                best = ended[index]
            index += 1
        if best is not None and op.tokens[resource] <= best.tokens[resource]:
            found.append(
                Violation(
                    "token-order",
                    f"{resource}: {op.describe(resource)} began after "
                    f"{best.describe(resource)} had released",
                )
            )
    return found


def _unreported(trace: Trace) -> list[Violation]:
    found: list[Violation] = []
    for op in trace.ops.values():
        for write in op.writes:
            exclusive = CAPACITY[write["res"]] == 1
            stale = exclusive and write["outcome"] == "refused-fence"
            if stale and not op.told and op.outcome is not None:  # None: killed, not told yet
                found.append(
                    Violation(
                        "unreported",
                        f"{write['res']}: {op.describe(write['res'])} had its write refused "
                        f"by a newer token and was never told it lost the lease",
                        KNOWN_RELEASE if op.outcome == "backend" else "",
                    )
                )
    return found


def _lost_updates(
    trace: Trace, history: list[dict[str, Any]], registers: dict[str, int]
) -> list[Violation]:
    found: list[Violation] = []
    applied: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in history:
        applied[row["register"]].append(row)
    for name, final in registers.items():
        rows = applied.get(name, [])
        values = sorted(row["value"] for row in rows)
        if values != list(range(1, len(rows) + 1)) or final != len(rows):
            dupes = sorted(v for v, n in Counter(values).items() if n > 1)
            found.append(
                Violation(
                    "lost-update",
                    f"{name}: {len(rows)} writes applied, the row holds {final}"
                    + (f", values written twice: {dupes[:10]}" if dupes else ""),
                )
            )
        tokens = [row["token"] for row in sorted(rows, key=lambda r: r["value"])]
        if None not in tokens and any(a >= b for a, b in itertools.pairwise(tokens)):
            found.append(Violation("token-order", f"{name}: applied writes' tokens do not rise"))
    logged = {(row["op"], row["register"]) for row in history}
    for op in trace.ops.values():
        for write in op.writes:
            key = (op.id, write["res"])
            if write["outcome"] == "ok" and key not in logged:
                found.append(
                    Violation("lost-update", f"{op.id} wrote {write} but it is not applied")
                )
            if write["outcome"].startswith("refused") and key in logged:
                found.append(Violation("lost-update", f"{op.id} was refused but applied: {write}"))
    return found


def _bounds(trace: Trace) -> list[Violation]:
    found: list[Violation] = []
    for op in trace.ops.values():
        if op.acq is None or op.bt is None:
            continue
        took = op.acq - op.start
        if took <= op.bt + BOUND_SLACK:
            continue
        window = Window(op.start, op.acq)
        if trace.stopped(op.pid, window):
            continue  # SIGSTOPped while it waited: its clock ran, it could not
        faults = sorted({f.kind for f in trace.faults_in(window) if f.kind in SERVER_FAULTS})
        found.append(
            Violation(
                "bound",
                f"{op.describe()} took {took:.2f} s to acquire with blocking_timeout "
                f"{op.bt} (faults meanwhile: {', '.join(faults) or 'none'})",
                KNOWN_BOUND if faults else "",
            )
        )
    return found
