"""Docs as tests: ``docs/quickstart.md`` followed literally in a new project.

The snippets marked ``<!-- test: ... -->`` are taken from the page as they
are (never copied here): the settings are appended to a fresh
``startproject``'s settings, the files are written where the page says, the
console lines are run, and the views answer as the page promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
MARKED = re.compile(r"<!-- test: (?P<what>[^ ]+) -->\n```[a-z]*\n(?P<code>.*?)```", re.S)

pytestmark = pytest.mark.slow

CHECK = """
import threading
import django
django.setup()
from django.test import Client, override_settings
from django.test.utils import setup_test_environment
from django_redislock import Lock

setup_test_environment()
client = Client()
assert client.get("/buy/1/").content == b"bought\\n"
assert client.get("/buy-by-hand/1/").content == b"bought\\n"
held, done = threading.Event(), threading.Event()

def hold():
    with Lock("sku:1"):
        held.set()
        done.wait(30)

holder = threading.Thread(target=hold)
holder.start()
held.wait(30)
with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0.2}):
    busy = client.get("/buy/1/")
done.set()
holder.join(30)
assert busy.status_code == 423, busy.status_code
assert int(busy["Retry-After"]) >= 1
print("quickstart ok")
"""


def snippets() -> list[tuple[str, str]]:
    found = [(m["what"], m["code"]) for m in MARKED.finditer(PAGE.read_text(encoding="utf-8"))]
    assert {what for what, _ in found} >= {"settings", "shell", "shop/views.py", "urls.py"}
    return found


def test_the_quickstart_works_in_a_new_project(tmp_path: Path, redis_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    env.pop("DATABASE_URL", None)

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    run("-m", "django", "startproject", "mysite", ".")
    run("manage.py", "startapp", "shop")
    settings = tmp_path / "mysite" / "settings.py"
    for what, code in snippets():
        if what == "settings":
            code = code.replace("redis://127.0.0.1:6379/0", redis_url)  # the suite's own server
            assert "6379" not in code
            settings.write_text(
                settings.read_text() + "\n" + code + '\nINSTALLED_APPS += ["shop"]\n'
            )
        elif what == "shell":
            for line in code.splitlines():
                command = line.split("#")[0].split()
                assert command[:2] == ["python", "manage.py"], line
                output = run("manage.py", *command[2:])
                assert "WARNINGS" not in output and "django_redislock.W" not in output, output
        else:
            target = tmp_path / ("mysite/urls.py" if what == "urls.py" else what)
            target.write_text(code)
    assert "quickstart ok" in run("-c", CHECK)
