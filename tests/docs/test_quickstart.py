"""Docs as tests: ``docs/quickstart.md`` followed literally in a new project.

Every snippet of the page is marked ``<!-- test: ... -->`` and taken from the
page as it is (never copied here): ``install`` (the checkout, put on
``PYTHONPATH`` instead of pip-installed), ``settings`` (appended to a fresh
``startproject``'s settings), ``shell`` (each console line run),
``dashboard`` (``createsuperuser`` without prompts, ``runserver`` started and
asked for the page's URL), a file (written where the page says) or
``+file`` (appended to it); then the views answer as the page promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import types
from collections.abc import Callable
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

# blocking_timeout=0: 423 at once, whatever BLOCKING_TIMEOUT (10 s by default)
import time
from django.test import RequestFactory
from shop import views
from shop.models import Account

held.clear(); done.clear()
holder = threading.Thread(target=hold)
holder.start()
held.wait(30)
started = time.monotonic()
now = client.get("/buy-now/1/")
took = time.monotonic() - started
done.set()
holder.join(30)
assert now.status_code == 423 and took < 5, (now.status_code, took)
assert client.get("/buy-now/1/").content == b"bought\\n"

# the lost-update recipe, on the page's own Account
account = Account.objects.create()
answer = views.add_points(RequestFactory().post("/", {"points": "3"}), pk=account.pk)
assert answer.content == b"3\\n", answer.content
views.add_points_later(account.pk, 4)
account.refresh_from_db()
assert account.points == 7, account.points

# the dashboard, for the superuser the page creates
assert client.login(username="admin", password=PASSWORD)
page = client.get(DASHBOARD)
assert page.status_code == 200 and b"Held locks" in page.content, page.status_code
print("quickstart ok")
"""
#: The page's ``createsuperuser`` runs without prompts: these answer them.
SUPERUSER = {
    "DJANGO_SUPERUSER_USERNAME": "admin",
    "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
    "DJANGO_SUPERUSER_PASSWORD": "quickstart-admin",
}


def snippets(backend: str | None = None) -> list[tuple[str, str]]:
    """The page's snippets in order; with ``backend``, only that backend's
    ``settings:<backend>`` block of the alternatives (``settings`` for it)."""
    text = PAGE.read_text(encoding="utf-8")
    found = [(m["what"], m["code"]) for m in MARKED.finditer(text)]
    assert {what for what, _ in found} >= {"settings", "shell", "shop/views.py", "urls.py"}
    # every snippet of the page is one of them: none is left untested
    assert len(found) == text.count("\n```") // 2, "a snippet of the page has no test: mark"
    if backend is None:
        return found
    return [
        ("settings" if what == f"settings:{backend}" else what, code)
        for what, code in found
        if not what.startswith("settings:") or what == f"settings:{backend}"
    ]


def backends() -> list[str]:
    """The cache backends the page offers a ``settings:<backend>`` block for."""
    return [what.split(":", 1)[1] for what, _ in snippets() if what.startswith("settings:")]


def dashboard_url() -> str:
    """The dashboard's address as the page gives it."""
    found = re.search(r"<http://127\.0\.0\.1:8000(/admin/[^>]+)>", PAGE.read_text())
    assert found, "the page names no dashboard URL"
    return found.group(1)


def test_every_snippet_of_the_quickstart_is_run() -> None:
    """The "Lost updates" block once imported a model the page never defined,
    and it was not among the tested snippets."""
    found = snippets()
    assert (
        "install",
        "pip install ./django-redislock        # the directory of your checkout\n",
    ) in found
    files = {what.lstrip("+") for what, _ in found} - {"install", "settings", "shell", "dashboard"}
    assert files == {"shop/views.py", "shop/models.py", "urls.py"} | {
        f"settings:{b}" for b in backends()
    }
    # Django's own RedisCache is shown, not only django-redis (#43)
    assert {"builtin", "django-redis"} <= set(backends())


@pytest.mark.parametrize("backend", backends())
def test_the_quickstart_works_in_a_new_project(
    tmp_path: Path, redis_url: str, backend: str
) -> None:
    """Every snippet in order, on each backend the page offers; ``manage.py
    check`` after each one, so no state the page leaves the reader in is
    broken (``urls.py`` once routed a view a later snippet defined)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    env.pop("DATABASE_URL", None)

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    run("-m", "django", "startproject", "mysite", ".")
    settings = tmp_path / "mysite" / "settings.py"
    for what, code in snippets(backend):
        apply_snippet(tmp_path, settings, what, code, run, env, redis_url)
        if what not in ("install", "shell", "dashboard"):  # a file the reader changed
            output = run("manage.py", "check")  # the state the page leaves them in
            assert "django_redislock.W" not in output, (what, code, output)
    check = CHECK.replace("PASSWORD", repr(SUPERUSER["DJANGO_SUPERUSER_PASSWORD"]))
    assert "quickstart ok" in run("-c", check.replace("DASHBOARD", repr(dashboard_url())))
    logged = run("-c", LOGGED)  # the page's LOGGING: level, logger and time
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING django_redislock\.probe a probe$",
        logged,
        re.M,
    ), logged


#: A record of the library's logger tree, in the project the page sets up.
LOGGED = """
import logging
import django
django.setup()
logging.getLogger("django_redislock.probe").warning("a probe")
"""


def apply_snippet(
    project: Path,
    settings: Path,
    what: str,
    code: str,
    run: Callable[..., str],
    env: dict[str, str],
    redis_url: str,
) -> None:
    """One snippet of the page, done as the page says."""
    if what == "install":  # the checkout is on PYTHONPATH (above)
        assert code.startswith("pip install ./django-redislock"), code
    elif what == "settings":
        code = code.replace("redis://127.0.0.1:6379/0", redis_url)  # the suite's own server
        assert "6379" not in code
        settings.write_text(settings.read_text() + "\n" + code)
    elif what == "shell":
        for line in code.splitlines():
            command = line.split("#")[0].split()
            assert command[:2] == ["python", "manage.py"], line
            output = run("manage.py", *command[2:])
            assert "WARNINGS" not in output and "django_redislock.W" not in output, output
    elif what == "dashboard":
        assert code.splitlines() == [
            "python manage.py createsuperuser", "python manage.py runserver"
        ], code  # fmt: skip
        env.update(SUPERUSER)
        run("manage.py", "createsuperuser", "--noinput")
        assert_serves_dashboard(project, env)
    else:
        file = "mysite/urls.py" if what.lstrip("+") == "urls.py" else what.lstrip("+")
        target = project / file
        if what.startswith("+"):
            code = target.read_text() + "\n\n" + code
        target.write_text(code)


def assert_serves_dashboard(project: Path, env: dict[str, str]) -> None:
    """``runserver`` (on a free port, not the page's 8000) serves the page's
    URL: to a visitor who is not logged in, the admin's login."""
    import http.client
    import signal
    import socket
    import time

    from tests.support.servers import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, "runserver exited"
                assert time.monotonic() < deadline, "runserver never listened"
                time.sleep(0.1)  # polling a port: nothing to wait on
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", dashboard_url())
        answer = conn.getresponse()
        conn.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    assert answer.status == 302, answer.status
    assert answer.getheader("Location", "").startswith("/admin/login/?next="), answer.getheader(
        "Location"
    )


def lost_update_recipe() -> types.ModuleType:
    """The page's lost-update block, with the test suite's ``Account`` for the shop's."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [code] = [code for code in blocks if "def add_points" in code]
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
