"""The nemesis in CI: short randomised fault-injection runs with fixed seeds.

Each run (``tests/faults/nemesis``) has six worker processes take every
primitive and read-modify-write fenced registers in the test database, while
the nemesis stops and kills them, restarts and pauses Redis and the Redlock
servers, and partitions, slows and resets the network; the checker then reads
the logs. The sabotage run swaps in a naive lock and must be caught: that is
what shows the checker can fail. The checker's own checks are also proven
one by one on hand-written logs, without servers. Longer runs:
``python -m tests.faults.nemesis --minutes 30 --seed 7`` (docs/faults.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults.nemesis import schedule
from tests.faults.nemesis.checker import KNOWN_BOUND, KNOWN_RELEASE, Report, check
from tests.faults.nemesis.run import Config, run
from tests.support.servers import REDIS_SERVER

pytestmark = [pytest.mark.faults]

#: One fixed seed per database: CI runs this module on SQLite, then on PostgreSQL,
#: each time 30 s of faults plus the 10 s sabotage run (about two minutes in all).
SEED_BY_DATABASE = {"sqlite": 1, "postgresql": 2}
SECONDS = 30.0

#: A run whose only violations are the defects of issue 31 items 1 and 2 (tagged
#: by the checker) was an expected failure while they were open; both are fixed,
#: so every violation fails the run. (True again only to bisect an old commit.)
TOLERATE_KNOWN_DEFECTS = False

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="needs a redis-server binary")


def _failure(report: Report, config: Config) -> str:
    return "\n".join(
        [
            report.summary(),
            *report.details(),
            f"logs: {report.log_dir}",
            f"replay: {config.replay()}",
        ]
    )


@needs_redis
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_promise_is_broken_under_random_faults(tmp_path: Path) -> None:
    from django.db import connection

    config = Config(SEED_BY_DATABASE.get(connection.vendor, 1), SECONDS, log_dir=tmp_path)
    report = run(config)
    print(report.summary())
    assert report.counts["held"] > 20, _failure(report, config)  # it did run
    assert report.counts["writes"] > 20, _failure(report, config)
    assert sum(report.faults.values()) >= 5, _failure(report, config)
    if TOLERATE_KNOWN_DEFECTS and report.only_known:
        pytest.xfail("only known defects (issue 31 items 1-2):\n" + _failure(report, config))
    assert report.ok, _failure(report, config)


@needs_redis
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sabotage_with_a_naive_lock_is_caught(tmp_path: Path) -> None:
    """The naive lock (fixed lease shorter than some sections, unconditional
    ``DEL``) under the same faults: overlaps nobody was told of, and lost updates."""
    config = Config(3, 10.0, sabotage=True, log_dir=tmp_path)
    report = run(config)
    checks = {violation.check for violation in report.violations}
    assert {"overlap", "lost-update"} <= checks, _failure(report, config)


# --- the schedule ----------------------------------------------------------------------


def test_the_schedule_is_a_function_of_the_seed() -> None:
    assert schedule.faults(7, 120) == schedule.faults(7, 120)
    assert schedule.faults(7, 120) != schedule.faults(8, 120)
    tracks = [schedule.faults(seed, 120) for seed in range(5)]
    kinds = {fault.kind for faults in tracks for track in faults.values() for fault in track}
    assert kinds == set(schedule.FAULT_WEIGHTS)
    plans = [schedule.next_op(schedule.worker_rng(7, 0), sabotage=False) for _ in range(3)]
    again = [schedule.next_op(schedule.worker_rng(7, 0), sabotage=False) for _ in range(3)]
    assert plans == again


# --- the checker, on hand-written logs ----------------------------------------------------


class Logs:
    """Writes a run's logs by hand: ``op`` adds one whole operation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.history: list[dict[str, Any]] = []
        self.registers = dict.fromkeys(schedule.RESOURCES, 0)
        self.lines: dict[str, list[dict[str, Any]]] = {"nemesis": []}

    def line(self, who: str, ev: str, t: float, **fields: Any) -> None:
        if who not in self.lines:
            worker = int(who.split("-")[1])
            self.lines[who] = [{"ev": "hello", "t": 0.0, "w": worker, "pid": 1000 + worker}]
        self.lines[who].append({"ev": ev, "t": t, **fields})

    def op(
        self,
        op_id: str,
        *,
        acq: float,
        rel: float,
        token: int | None,
        res: str = "lock",
        start: float | None = None,
        write: str | None = "ok",
        outcome: str = "ok",
        bt: float = 2.0,
        renew: bool = False,
    ) -> None:
        who = f"worker-{int(op_id.split('.')[0]):03d}"
        start = acq - 0.01 if start is None else start
        self.line(who, "start", start, op=op_id, kind="lock", res=[res], mode="w", bt=bt,
                  lease=1.0, renew=renew)  # fmt: skip
        self.line(who, "acq", acq, op=op_id, ok=True)
        self.line(who, "token", acq, op=op_id, res=res, token=token)
        if write is not None:
            value = self.registers[res] + 1
            if write == "ok":
                self.registers[res] = value
                self.history.append({"register": res, "value": value, "token": token, "op": op_id})
            self.line(who, "write", rel, op=op_id, res=res, token=token, value=value, outcome=write)
        self.line(who, "rel", rel, op=op_id)
        self.line(who, "end", rel + 0.01, op=op_id, outcome=outcome, err="")

    def check(self) -> Report:
        for who, lines in self.lines.items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (self.path / f"{who}.log").write_text(text)
        return check(self.path, self.history, self.registers, Report(0, 1.0, 2, "test"))


def _checks(report: Report) -> list[str]:
    return sorted(violation.check for violation in report.violations)


def test_checker_passes_a_clean_history(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=2.0, token=10)
    logs.op("1.1", acq=2.1, rel=3.0, token=11)
    report = logs.check()
    assert report.ok, report.details()
    assert report.counts["writes"] == 2


def test_checker_fails_an_overlap_nobody_was_told_of(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=3.0, token=10, write=None)
    logs.op("1.1", acq=2.0, rel=2.5, token=11)
    assert _checks(logs.check()) == ["overlap"]


def test_checker_accepts_an_overlap_the_stale_holder_was_told_of(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=3.0, token=10, write="refused-fence", outcome="lost")
    logs.op("1.1", acq=2.0, rel=2.5, token=11)
    report = logs.check()
    assert report.ok, report.details()
    assert report.counts["told"] == 1
    assert report.counts["refused-fence"] == 1


def test_checker_fails_two_holders_inside_one_lease_told_or_not(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=3.0, token=10, write="refused-fence", outcome="lost")
    logs.op("1.1", acq=1.5, rel=2.5, token=11)  # 0.1's lease of 1 s began at 0.99 at the earliest
    assert _checks(logs.check()) == ["exclusion"]
    logs.lines.pop("worker-000")
    logs.op("0.1", acq=1.0, rel=3.0, token=10, write=None, outcome="lost", renew=True)
    assert logs.check().ok  # with the watchdog, a hand-off's first lease is shorter


def test_checker_does_not_blame_a_stale_holder_killed_before_it_could_be_told(
    tmp_path: Path,
) -> None:
    logs = Logs(tmp_path)
    logs.line("worker-000", "start", 0.99, op="0.1", kind="lock", res=["lock"], mode="w",
              bt=2.0, lease=1.0, renew=False)  # fmt: skip
    logs.line("worker-000", "acq", 1.0, op="0.1", ok=True)
    logs.line("worker-000", "token", 1.0, op="0.1", res="lock", token=10)
    logs.op("1.1", acq=2.0, rel=2.5, token=11)
    logs.line("nemesis", "fault", 2.2, kind="kill_holder", pid=1000, w=0)
    logs.line("nemesis", "healed", 2.2, kind="kill_holder", pid=1000)
    assert logs.check().ok
    logs.lines["worker-001"].clear()
    logs.op("1.1", acq=1.5, rel=2.5, token=11, write=None)  # inside 0.1's lease
    assert _checks(logs.check()) == ["exclusion"]


def test_checker_tags_an_untold_overlap_after_a_failed_release_as_known(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=3.0, token=10, write=None, outcome="backend")
    logs.op("1.1", acq=2.0, rel=2.5, token=11)
    report = logs.check()
    assert [v.known for v in report.violations] == [KNOWN_RELEASE]


def test_checker_fails_a_lease_loss_never_reported(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("1.1", acq=1.0, rel=1.5, token=11)
    logs.op("0.1", acq=2.0, rel=2.5, token=10, write="refused-fence")
    assert "unreported" in _checks(logs.check())


def test_checker_fails_a_lost_update(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=2.0, token=10)
    logs.op("1.1", acq=2.1, rel=3.0, token=11)
    logs.history[1]["value"] = 1  # both wrote 1: the second increment is lost
    logs.registers["lock"] = 1
    assert _checks(logs.check()) == ["lost-update"]


def test_checker_fails_a_write_reported_but_not_applied(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=2.0, token=10)
    logs.history.clear()
    logs.registers["lock"] = 0
    assert _checks(logs.check()) == ["lost-update"]


def test_checker_fails_a_token_out_of_order(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", acq=1.0, rel=2.0, token=10, write=None)
    logs.op("1.1", acq=2.5, rel=3.0, token=9, write=None)
    assert _checks(logs.check()) == ["token-order"]


def test_checker_fails_an_acquire_past_its_bound(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.op("0.1", start=1.0, acq=3.6, rel=4.0, token=10, bt=2.0)
    report = logs.check()
    assert _checks(report) == ["bound"]
    assert report.violations[0].known == ""


def test_checker_excuses_a_stopped_waiter_and_tags_a_slow_redis(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.line("nemesis", "fault", 1.5, kind="pause_holder", pid=1000)
    logs.line("nemesis", "healed", 2.5, kind="pause_holder", pid=1000)
    logs.op("0.1", start=1.0, acq=3.6, rel=4.0, token=10, bt=2.0)
    logs.line("nemesis", "fault", 5.5, kind="slow", latency=0.2)
    logs.line("nemesis", "healed", 6.0, kind="slow")
    logs.op("1.1", start=5.0, acq=7.6, rel=8.0, token=11, bt=2.0)
    logs.line("nemesis", "stall", 10.0, since=9.5, took=0.5)  # a slow PING, no fault
    logs.op("0.2", start=9.0, acq=11.6, rel=12.0, token=12, bt=2.0)
    report = logs.check()
    assert [(v.check, v.known) for v in report.violations] == [("bound", KNOWN_BOUND)] * 2
    assert report.faults == {"pause_holder": 1, "slow": 1}


def test_checker_fails_an_operation_that_never_ended_unkilled(tmp_path: Path) -> None:
    logs = Logs(tmp_path)
    logs.line("worker-000", "start", 1.0, op="0.1", kind="lock", res=["lock"], mode="w",
              bt=2.0, lease=1.0, renew=True)  # fmt: skip
    assert _checks(logs.check()) == ["crash"]
    logs.line("nemesis", "fault", 2.0, kind="kill_holder", pid=1000, w=0)
    logs.line("nemesis", "healed", 2.0, kind="kill_holder", pid=1000)
    assert logs.check().ok
