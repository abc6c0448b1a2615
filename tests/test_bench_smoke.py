"""The benchmark harnesses run end to end in quick mode, every library included.

Not a speed test: timing targets live in ``python -m bench``'s own report. This
only proves the harness works, finds no mutual-exclusion violation, and reports
per-use and reused ratios and Redis time per cycle against the raw floor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.client_cost import CANNED_CYCLES
from bench.libs import LIBRARIES
from bench.report import render
from tests.support.servers import REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-m", "bench"]


def run_bench(command: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """A bench run from the project root, outside the test suite's Django settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_SETTINGS")}
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_quick_bench_of_every_library() -> None:
    for peer in ("redis_lock", "pottery"):  # the bench extra (not in the version matrix)
        pytest.importorskip(peer)
    completed = run_bench([*BENCH, "--quick", "--json", "--processes", "3"], timeout=60)
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)

    assert list(data["uncontended"]) == ["per_use", "reused"]  # per use first
    for rows in data["uncontended"].values():
        assert set(rows) == set(LIBRARIES)
        assert rows["raw"]["ratio_to_raw"] == pytest.approx(1.0)
        assert rows["raw"]["redis_top_x_raw"] == pytest.approx(1.0)
        for lib, row in rows.items():
            assert row["ratio_to_raw"] > 0, lib
            assert "cpu_ratio_to_raw" in row
            assert row["redis_us_top"] > 0, lib  # the server timed this library's commands
            assert row["redis_us_all"] >= row["redis_us_top"], lib
            assert row["redis_calls_per_cycle"].get("evalsha", 0) >= 1, lib  # every release
    contended = data["contended"]
    assert set(contended) == set(LIBRARIES) - {"raw"}  # the floor has no fair wait to measure
    for lib, modes in contended.items():
        assert set(modes) == {"polite", "greedy"}
        for mode in modes.values():
            assert mode["violations"] == 0
            assert mode["acquisitions"] > 0
            # A peer that sleeps between tries (redis-py's sleep=0.1) may hand
            # over no lock in a 0.3 s run on a loaded machine: no gap to report.
            # Ours wakes the next waiter on every release.
            if lib == "redislock":
                assert mode["p50_ms"] is not None
            else:
                assert mode["p50_ms"] is None or mode["p99_ms"] >= mode["p50_ms"] >= 0, lib

    text = render(data)
    per_use, reused = text.index("Per use ("), text.index("Reused (")
    assert per_use < reused < text.index("Handoff gap")
    for lib, label in data["meta"]["labels"].items():
        rows = [line for line in text.splitlines() if line.strip().startswith(label + "  ")]
        assert len(rows) == (2 if lib == "raw" else 3), label  # per use, reused, handoff
    assert "Redis top" in text and "Redis all" in text
    assert "per use at least as fast as redis-py Lock" in text
    twin = data["uncontended"]["per_use"]["redispy-fast"]["ratio_to_raw"]
    assert f"(its twin, sleep=0.001: {twin:.2f}x)" in text  # the run's own noise, beside 3%
    assert "mutual-exclusion violations = 0" in text


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_semaphore_bench_reports_every_contender_against_the_floor() -> None:
    completed = run_bench(
        [sys.executable, "bench/bench_semaphore.py", "--seconds", "0.02", "--rounds", "2"],
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    rows = [line for line in lines if "x floor" in line and "Redis" not in line]
    names = ["Semaphore", "Sem/use", "seed", "least", "raw"]
    assert [row.split()[0] for row in rows] == names
    assert all("CPU" in row for row in rows) or sys.platform != "linux"
    assert "Semaphore vs seed fair:" in completed.stdout
    redis_rows = [line for line in lines if "Redis top" in line]
    assert [row.split()[0] for row in redis_rows] == names
    assert "1.00x floor   all" in redis_rows[3]  # the floor (least leased) against itself


@pytest.mark.skipif(REDIS_SERVER is None, reason="the probe starts its own redis-server")
@pytest.mark.parametrize("mode", ["pipelined", "sequential"])
def test_script_cost_probe_runs_every_contender_on_its_fast_path(mode: str) -> None:
    command = [sys.executable, "-m", "bench.script_cost", "--rounds", "2", "--cycles", "30"]
    if mode == "sequential":
        command.append("--sequential")
    completed = run_bench([*command, "--json"], timeout=60)
    assert completed.returncode == 0, completed.stderr  # it fails when a cycle left its fast path
    data = json.loads(completed.stdout)
    assert data["mode"] == mode
    groups = data["groups"]
    # Redis 7 and Valkey 8 have FUNCTION; the FCALL contender runs the same scripts
    shared = ["floor", "least scripted", "least fair fenced"]
    assert list(groups["Lock"]) == [
        *shared, "Lock", "Lock, fencing=True", "Lock, fencing=True (FCALL)"
    ]  # fmt: skip
    assert list(groups["Semaphore"]) == [
        "floor", "raw ZADD/ZREM", "least scripted", "least fair fenced", "Semaphore",
        "Semaphore, fencing=True",
    ]  # fmt: skip
    for contenders in groups.values():
        assert contenders["floor"]["min_x_floor"] == pytest.approx(1.0)
        for name, row in contenders.items():
            assert row["min_us"] > 0 and row["median_us"] >= row["min_us"], name


@pytest.mark.skipif(REDIS_SERVER is None, reason="the probe starts its own redis-server")
def test_client_cost_probe_splits_the_gap_to_the_floor() -> None:
    command = [sys.executable, "-m", "bench.client_cost", "--rounds", "3", "--cycles", "50"]
    completed = run_bench([*command, "--json"], timeout=60)
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    rows = data["contenders"]
    assert list(rows) == [
        "floor", "redis-py Lock", "Lock's scripts, bare", "Lock", "Lock, canned replies",
        "redis-py Lock, canned replies", "floor + Lock canned",
    ]  # fmt: skip
    assert rows["floor"]["x_floor"] == pytest.approx(1.0)
    for canned in CANNED_CYCLES:
        assert rows[canned]["x_floor"] is None  # no round trip to compare
    for name, row in rows.items():
        assert row["median_us"] > 0, name
    assert data["own_python_alone_us"] == rows["Lock, canned replies"]["median_us"]
    assert data["redispy_python_alone_us"] == rows["redis-py Lock, canned replies"]["median_us"]
    split = data["split_us"]
    assert list(split) == [
        "commands (scripts bare - floor)",
        "own Python between round trips (floor + canned - floor)",
        "rest",
    ]
    assert sum(split.values()) == pytest.approx(data["gap_us"])


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_renewal_capacity_probe_holds_and_counts() -> None:
    command = [sys.executable, "-m", "bench.renewal_capacity", "--counts", "30"]
    completed = run_bench([*command, "--lease", "0.6", "--hold", "1", "--json"], timeout=60)
    assert completed.returncode == 0, completed.stderr
    [row] = json.loads(completed.stdout)["rows"]
    assert row["count"] == 30
    assert row["lost"] == 0
    assert row["renewals_per_s"] > 0  # the watchdog renewed them while they were held
    assert row["calls_per_s"] < row["renewals_per_s"]  # many per call
    assert row["watchdog_cpu"] > 0 and row["redis_us_per_renewal"] > 0 and row["floor_us"] > 0
    assert row["lag_warning_s"] is None and row["first_loss_s"] is None
    assert row["watching_after"] == 0


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_waiters_probe_runs_many_waiters_in_a_process_of_its_own() -> None:
    """``bench.waiters`` (issue 41's table) in quick mode on its smallest load:
    every waiter is answered with no backend error, within the pool's cap."""
    command = [sys.executable, "-m", "bench.waiters", "--quick", "--only", "120 threads", "--json"]
    result = run_bench(command, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(result.stdout)
    assert [row["socket_timeout"] for row in rows] == [5.0, 0.5]
    for row in rows:
        assert row["errors"] == 0 and row["acquired"] > 0, row
        assert row["peak_connections"] <= row["pool_cap"], row
