"""The benchmark harness runs end to end: quick mode, our Lock and the raw floor only.

Not a speed test: timing targets live in ``python -m bench``'s own report. This
only proves the harness works, finds no mutual-exclusion violation, and reports
ratios to the raw floor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import render
from tests.servers import REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-m", "bench"]


def run_bench(command: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """A bench run from the project root, outside the test suite's Django settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_SETTINGS")}
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_quick_bench_of_lock_and_raw() -> None:
    completed = run_bench(
        [*BENCH, "--quick", "--json", "--libs", "redislock,raw", "--processes", "3"], timeout=30
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)

    assert set(data["uncontended"]) == {"redislock", "raw"}
    assert data["uncontended"]["raw"]["ratio_to_raw"] == pytest.approx(1.0)
    assert data["uncontended"]["redislock"]["ratio_to_raw"] > 0
    assert "cpu_ratio_to_raw" in data["uncontended"]["redislock"]
    modes = data["contended"]["redislock"]
    assert set(modes) == {"polite", "greedy"}
    for mode in modes.values():
        assert mode["violations"] == 0
        assert mode["acquisitions"] > 0
        assert mode["p50_ms"] is not None
    assert "raw" not in data["contended"]  # the floor has no fair wait to measure

    text = render(data)
    assert "x raw" in text
    assert "django-redislock Lock" in text
    assert "mutual-exclusion violations = 0" in text


@pytest.mark.skipif(REDIS_SERVER is None, reason="the bench starts its own redis-server")
def test_semaphore_bench_reports_every_contender_against_the_floor() -> None:
    completed = run_bench(
        [sys.executable, "bench/bench_semaphore.py", "--seconds", "0.02", "--rounds", "2"],
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    rows = [line for line in completed.stdout.splitlines() if "x floor" in line]
    assert [row.split()[0] for row in rows] == ["Semaphore", "seed", "raw"]
    assert all("CPU" in row for row in rows) or sys.platform != "linux"
    assert "Semaphore vs seed fair:" in completed.stdout
