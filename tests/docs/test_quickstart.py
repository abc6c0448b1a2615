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
import threading
import types
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parents[2]
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


def lost_update_recipe() -> types.ModuleType:
    """The page's lost-update block, with the test suite's ``Account`` for the shop's."""
    text = PAGE.read_text(encoding="utf-8")
    [code] = [code for code in re.findall(r"```python\n(.*?)```", text, re.S) if "points" in code]
    assert "from shop.models import Account\n" in code
    code = code.replace("from shop.models import Account", "from tests.models import Account")
    module = types.ModuleType("quickstart_points")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    from django.urls import path

    module.urlpatterns = [path("points/<int:pk>/", module.add_points)]
    return module


@pytest.mark.django_db(transaction=True)
def test_the_lost_update_recipe_loses_no_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads add 20 points each, two through the view (under
    ``ATOMIC_REQUESTS``), two through the function: no addition is lost."""
    from tests.models import Account

    recipe = lost_update_recipe()
    account = Account.objects.create()
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(sys.modules, recipe.__name__, recipe)
    failures: list[BaseException] = []

    def add(by_view: bool) -> None:
        client = Client()
        try:
            for _ in range(20):
                if by_view:
                    answer = client.post(f"/points/{account.pk}/", {"points": "1"})
                    assert answer.status_code == 200, answer
                else:
                    recipe.add_points_later(account.pk, 1)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)
        finally:
            connection.close()

    with override_settings(ROOT_URLCONF=recipe.__name__):
        threads = [threading.Thread(target=add, args=(n % 2 == 0,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not failures, failures
    account.refresh_from_db()
    assert account.points == 80


@pytest.mark.django_db(transaction=True)
def test_a_lock_block_inside_a_transaction_ends_before_the_commit() -> None:
    """What the page warns of: a ``with Lock`` block releases at its end."""
    from django_redislock import Lock

    with transaction.atomic():
        with Lock("account:1"):
            pass
        assert not Lock("account:1").locked()  # the next holder may read the old row


def async_recipe() -> types.ModuleType:
    """The page's async block, as a module."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [code] = [code for code in blocks if "AsyncLock" in code]
    module = types.ModuleType("quickstart_async")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


def test_the_async_views_answer_200_and_423_while_held() -> None:
    import asyncio

    from django.test import RequestFactory

    from django_redislock import Lock

    recipe = async_recipe()
    request = RequestFactory().get("/")
    views = (recipe.buy_async, recipe.buy_async_by_hand)
    for view in views:
        assert asyncio.run(view(request, pk=7)).content == b"bought\n"
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with Lock("sku:7"):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        with override_settings(REDISLOCK={"BLOCKING_TIMEOUT": 0.2}):
            busy = asyncio.run(recipe.buy_async(request, pk=7))
        assert busy.status_code == 423 and int(busy["Retry-After"]) >= 1
        real = recipe.AsyncLock  # the page waits 5 s: shorter here
        recipe.AsyncLock = lambda name, **kw: real(name, **{**kw, "blocking_timeout": 0.2})
        busy = asyncio.run(recipe.buy_async_by_hand(request, pk=7))
        assert busy.status_code == 423 and int(busy["Retry-After"]) >= 1
    finally:
        done.set()
        holder.join(30)
