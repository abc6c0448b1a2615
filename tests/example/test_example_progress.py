"""``oversell_demo``'s progress off a terminal: a line per update, not every
redraw piled onto one line with carriage returns."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.example.test_example_project import manage

PROGRESS = """
import io
from example_project.shop.management.commands.oversell_demo import Command

class Terminal(io.StringIO):
    def isatty(self):
        return True

for stream in (io.StringIO(), Terminal()):
    command = Command(stdout=stream)
    command._shown = None
    for done in (0, 0, 3, 10, 11, 20, 55, 99):
        command._progress("naive", done, 100)
    command._progress("naive", 100, 100, final=True)
    print(repr(stream.getvalue()))
"""


def test_progress_is_a_line_per_update_off_a_terminal(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    result = manage(tmp_path, "shell", "-c", PROGRESS)
    assert result.returncode == 0, result.stderr
    captured, terminal = (eval(line) for line in result.stdout.splitlines()[-2:])
    assert "\r" not in captured
    lines = captured.splitlines()
    # the start, each tenth of the way (10, 20, 55, 99: not 3 or 11), and the end
    assert [re.search(r"(\d+)/100$", line).group(1) for line in lines] == [  # type: ignore[union-attr]
        "0", "10", "20", "55", "99", "100",
    ], captured  # fmt: skip
    assert lines[-1] == "  naive                    [" + "#" * 30 + "] 100/100"
    # on a terminal the bar is redrawn in place, and the last redraw ends the line
    assert terminal.count("\r") == 9 and terminal.endswith("100/100\n"), terminal


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_oversell_demo_output_in_a_pipe_has_no_carriage_returns(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    result = manage(
        tmp_path,
        "oversell_demo",
        "--workers", "2", "--stock", "4", "--attempts", "4", "--think-ms", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stdout
    bars = [line for line in result.stdout.splitlines() if "] " in line and "/8" in line]
    assert any(line.endswith("8/8") for line in bars), result.stdout
    assert all(line.count("[") == 1 for line in bars), result.stdout
