"""``scripts/test`` and ``scripts/_venv.sh``, run with stand-in tools.

The stand-ins (a fake virtualenv whose ``python``, ``ruff``, ``mypy``, ``lint-imports`` and
``mkdocs`` log their arguments and exit as told) let these tests check what
the scripts run and how they report it without running the suite itself.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
case "$(basename "$0") $*" in
  {fail}) exit 1 ;;
esac
exit 0
"""


#: What ``scripts/_venv.sh`` installs when not told (``VENV_EXTRAS``).
DEFAULT_EXTRAS = re.search(  # type: ignore[union-attr]
    r'VENV_EXTRAS="\$\{VENV_EXTRAS:-([a-z,]+)\}"', (ROOT / "scripts" / "_venv.sh").read_text()
).group(1)


def stamp_name(extras: str) -> str:
    """The name ``scripts/_venv.sh`` gives the mark of a finished install."""
    data = (
        (ROOT / "pyproject.toml").read_bytes()
        + (ROOT / "scripts" / "_venv.sh").read_bytes()
        + f"{extras}\n".encode()
    )
    return f".installed-{hashlib.sha1(data).hexdigest()[:12]}"


def fake_venv(tmp_path: Path, fail: list[str]) -> tuple[Path, Path]:
    """A virtualenv that ``scripts/_venv.sh`` takes as installed; each tool
    exits 1 when its command line starts with one of ``fail``."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    pattern = "|".join(f'"{prefix}"*' for prefix in fail)
    for tool in ("python", "ruff", "mypy", "lint-imports", "mkdocs"):
        path = venv / "bin" / tool
        path.write_text(STAND_IN.format(log=log, fail=pattern))
        path.chmod(0o755)
    (venv / stamp_name(DEFAULT_EXTRAS)).touch()
    return venv, log


def run_test_script(
    tmp_path: Path,
    fail: list[str],
    *,
    database_url: str | None = "postgres://nobody@127.0.0.1:1/none",
) -> tuple[subprocess.CompletedProcess[str], str]:
    venv, log = fake_venv(tmp_path, fail)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VENV_EXTRAS", "DATABASE_URL")},
        "VENV": str(venv),
        "REDISLOCK_REQUIRE_REDIS": "1",  # the Valkey phase runs whatever the machine has
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, log.read_text()


def test_every_phase_runs_after_a_failure_and_all_are_reported(tmp_path: Path) -> None:
    """The first run on a fresh clone failed one test: ``set -e`` ended the
    script there, and the Valkey phase never ran."""
    result, calls = run_test_script(tmp_path, fail=["ruff check", "python -m pytest"])
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    # the failing lint phase stopped at its first failure, and everything after it ran
    assert "ruff format" not in calls and "mypy" not in calls, calls
    assert "mkdocs build" in calls
    assert calls.count("python -m pytest") == 3, calls  # Redis, Valkey, PostgreSQL
    summary = out[out.index("== summary") :]
    for outcome, phase in [
        ("FAILED (exit 1)", "lint: ruff, mypy, lint-imports"),
        ("ok", "docs: mkdocs build --strict"),
        ("FAILED (exit 1)", "tests on SQLite, Redis (the whole suite)"),
        ("FAILED (exit 1)", "core tests on SQLite, Valkey"),
        ("FAILED (exit 1)", "database tests on PostgreSQL"),
    ]:
        assert re.search(rf"{re.escape(outcome)} +\d+ s  {re.escape(phase)}", summary), summary
    assert re.search(r"== total: \d+ s, 4 of 5 phase\(s\) failed", summary), summary


def test_the_summary_lists_a_phase_not_run_and_why(tmp_path: Path) -> None:
    """Without DATABASE_URL the PostgreSQL phase was left out silently: the
    summary listed 4 phases and said nothing of a fifth."""
    result, calls = run_test_script(tmp_path, fail=["no-such-command"], database_url=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls.count("python -m pytest") == 2, calls  # Redis, Valkey
    summary = result.stdout[result.stdout.index("== summary") :]
    assert re.search(r"skipped +database tests on PostgreSQL: DATABASE_URL is not set", summary), (
        summary
    )
    assert re.search(r"== total: \d+ s, 0 of 4 phase\(s\) failed, 1 skipped", summary), summary


def test_a_phase_fails_at_its_first_failing_command(tmp_path: Path) -> None:
    result, calls = run_test_script(tmp_path, fail=["mypy"])
    assert result.returncode == 1
    assert "ruff format" in calls
    assert re.search(r"== total: \d+ s, 1 of 5 phase\(s\) failed", result.stdout), result.stdout


def test_a_green_run_exits_zero(tmp_path: Path) -> None:
    result, _ = run_test_script(tmp_path, fail=["no-such-command"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"== total: \d+ s, 0 of 5 phase\(s\) failed, 0 skipped", result.stdout)


def test_the_full_virtualenv_has_the_shops_extra_too() -> None:
    """The suite runs the example shop under gunicorn and uvicorn (the shop extra)."""
    assert set(DEFAULT_EXTRAS.split(",")) >= {"test", "lint", "docs", "shop"}
    shop = (ROOT / "scripts" / "shop").read_text()
    assert 'VENV="${VENV:-$PWD/.venv-shop}" VENV_EXTRAS=shop' in shop


def test_the_ci_runs_the_test_script_under_errexit() -> None:
    """``.ci/run`` runs ``bash scripts/test`` in ``timed`` under ``set -e``: a
    failed phase must still fail CI, which it does through the exit status."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "timed bash scripts/test" in ci


def test_the_editable_install_hides_setuptools_boxed_notice() -> None:
    """``pip install -e`` showed setuptools' boxed "Editable installation ...
    Please be careful with folders in your working directory" (information
    only, pip relays it as a ``BuildBackendWarning``) to someone setting up the
    demo. A warnings filter on that message alone hides it: pip applies the
    filter when it relays the backend's warning (checked by hand with pip 26)."""
    venv_sh = (ROOT / "scripts" / "_venv.sh").read_text()
    install = venv_sh[venv_sh.index('PYTHONWARNINGS="ignore:Editable installation') :]
    assert install.splitlines()[1].strip().startswith('"$VENV/bin/python" -m pip install')
