"""The Locks panel for django-debug-toolbar (``django_redislock.debug_toolbar``).

The toolbar is installed for these tests only (``override_settings``), as a
project would in development; its panels are rendered into the response
(``RENDER_PANELS``) so the test reads what a developer sees.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.staticfiles.handlers import StaticFilesHandler as _StaticFilesHandler
from django.test import AsyncClient, Client, override_settings
from django.test.testcases import LiveServerThread

from django_redislock import Lock, signals
from tests.settings import redis_cache
from tests.support.other_holders import OtherThread
from tests.support.servers import free_port

pytest.importorskip("debug_toolbar")
from debug_toolbar.settings import PANELS_DEFAULTS

from tests.example.test_e2e import browser, screenshot  # noqa: F401

EVIL = "<b>sku</b>:42"  # the name tests/support/toolbar_views.py locks
PANEL = "django_redislock.debug_toolbar.LocksPanel"


def toolbar_settings(panels: list[str]) -> dict[str, Any]:
    return {
        "DEBUG": True,
        "INSTALLED_APPS": [*settings.INSTALLED_APPS, "debug_toolbar"],
        "MIDDLEWARE": ["debug_toolbar.middleware.DebugToolbarMiddleware", *settings.MIDDLEWARE],
        "ROOT_URLCONF": "tests.support.toolbar_views",
        "INTERNAL_IPS": ["127.0.0.1"],
        "DEBUG_TOOLBAR_PANELS": panels,
        "DEBUG_TOOLBAR_CONFIG": {
            "SHOW_TOOLBAR_CALLBACK": lambda request: True,
            "IS_RUNNING_TESTS": False,
            "RENDER_PANELS": True,
        },
        "CACHES": {**settings.CACHES, "down": redis_cache(f"redis://127.0.0.1:{free_port()}/0")},
    }


@pytest.fixture
def holder_elsewhere(other_thread: OtherThread) -> Iterator[None]:
    held = Lock("report:daily", timeout=300, auto_renew=False)
    assert other_thread(held.acquire)
    yield
    other_thread(held.release)


def rows(content: str) -> list[list[str]]:
    """The panel's table rows, each as its cells' text."""
    table = content.split('class="djdt-redislock-locks"', 1)[1].split("</table>", 1)[0]
    body = table.split("<tbody>", 1)[1]
    return [
        [
            unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_the_panel_lists_every_acquire_in_order(holder_elsewhere: None) -> None:
    with override_settings(**toolbar_settings([PANEL])):
        response = Client().get("/locks/")
    html = response.content.decode()
    assert "&lt;b&gt;sku&lt;/b&gt;:42" in html
    assert "<b>sku</b>" not in html
    table = rows(html)
    assert [row[1:3] for row in table] == [
        [EVIL, "lock"],
        ["exports:7", "semaphore"],
        ["catalog", "rwlock read"],
        ["report:daily", "lock"],
        ["report:daily", "lock"],
        ["sku:down", "lock"],
    ]
    outcomes = [row[5] for row in table]
    assert outcomes[:3] == ["held", "held", "held"]
    holder = f"held by {socket.gethostname()} pid {os.getpid()} thread other-holder"
    assert outcomes[3].startswith(f"timed out: {holder}")  # who held it, and for how long
    assert outcomes[4].startswith(f"refused: {holder}") and outcomes[4].endswith(" s")
    assert outcomes[5].startswith("backend error: ") and "sku:down" in outcomes[5]
    assert [row[6] for row in table] == ["yes", "no", "no", "yes", "yes", "yes"]
    fence, permit_fence = table[0][7], table[1][7]
    assert int(fence) > 0 and int(permit_fence) > 0
    assert [row[7] for row in table[3:]] == ["—"] * 3
    assert all(row[4].endswith(" ms") for row in table[:3])  # held, then released
    assert [row[4] for row in table[3:]] == ["—"] * 3  # never held
    timed_out_ms = float(table[3][3].removesuffix(" ms"))
    assert 250 <= timed_out_ms < 5000
    subtitle = re.search(r"6 locks, ([0-9.]+)ms waiting", html)
    assert subtitle is not None
    total = sum(float(row[3].removesuffix(" ms")) for row in table)
    assert float(subtitle.group(1)) == pytest.approx(total, abs=0.05)
    # no receiver left behind: the panel connects only while it records a request
    assert not signals.wanted(signals.lock_released)
    assert not signals.wanted(signals.lock_failed)


def test_lost_leases_are_shown_lost_whichever_thread_found_them() -> None:
    with override_settings(**toolbar_settings([PANEL])):
        html = Client().get("/lost/").content.decode()
    table = rows(html)
    assert [row[1] for row in table] == ["gone:released", "gone:renewed"]
    assert [row[5].partition(":")[0] for row in table] == ["lost", "lost"]
    assert "release" in table[0][5] and table[1][5] != "lost"  # with the reason
    assert all(row[4].endswith(" ms") for row in table)


def test_a_hold_capped_by_max_hold_is_shown_lost_with_why() -> None:
    with override_settings(**toolbar_settings([PANEL])):
        html = Client().get("/capped/").content.decode()
    [row] = rows(html)
    assert row[1] == "gone:capped"
    assert row[5].startswith("lost")
    assert "held longer than max_hold=0.5s" in row[5]


def test_async_views_and_their_tasks_are_recorded() -> None:
    async def get() -> str:
        response = await AsyncClient().get("/async/")
        return bytes(response.content).decode()

    with override_settings(**toolbar_settings([PANEL])):
        html = async_to_sync(get)()
    table = rows(html)
    assert [row[1:3] for row in table] == [
        ["cart:async", "lock"],
        *[["exports:async", "semaphore"]] * 3,
    ]
    assert {row[5] for row in table} == {"held"}
    assert all(row[4].endswith(" ms") for row in table)
    assert "4 locks, " in html


def test_a_lazily_taken_fencing_token_is_not_taken_for_the_panel() -> None:
    with override_settings(**toolbar_settings([PANEL])):
        html = Client().get("/idle/").content.decode()
    (row,) = rows(html)
    assert row[1:3] == ["sku:1", "lock"] and row[5] == "held" and row[7] == "—"
    assert "1 lock, 0.00ms waiting" in html


def test_without_the_panel_no_receiver_is_connected() -> None:
    panels = ["debug_toolbar.panels.timer.TimerPanel"]
    with override_settings(**toolbar_settings(panels)):
        response = Client().get("/idle/")
    assert response.status_code == 200
    for signal in (
        signals.lock_acquired, signals.lock_released, signals.lock_contended,
        signals.lock_lost, signals.lock_failed,
    ):  # fmt: skip
        assert not signals.wanted(signal)  # the app's own counting is no receiver


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """A live server started under the settings in force: pytest-django's
    ``live_server`` built its middleware before the toolbar was installed."""
    server = LiveServerThread("localhost", _StaticFilesHandler)
    server.daemon = True
    server.start()
    assert server.is_ready.wait(30)
    if server.error:
        raise server.error
    try:
        yield f"http://localhost:{server.port}"
    finally:
        server.terminate()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_panel_in_chromium(holder_elsewhere: None, browser: Any) -> None:  # noqa: F811
    """The panel as a developer sees it; ``docs/img/debug-toolbar-locks.png``
    (with ``REDISLOCK_UPDATE_SCREENSHOT=1``)."""
    with (
        override_settings(
            **toolbar_settings([*PANELS_DEFAULTS, PANEL]), ALLOWED_HOSTS=["localhost"]
        ),
        serving() as url,
    ):
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        try:
            page.goto(f"{url}/locks/")
            nav = page.locator("#djDebug #djdt-LocksPanel")
            assert re.fullmatch(r"Locks\s+6 locks, [0-9.]+ms waiting", nav.inner_text().strip())
            nav.click()
            panel = page.locator("#djDebug #LocksPanel")
            panel.locator("table.djdt-redislock-locks").wait_for()
            cells = panel.locator("table.djdt-redislock-locks tbody tr td:nth-child(2)")
            assert cells.all_inner_texts() == [
                EVIL, "exports:7", "catalog", "report:daily", "report:daily", "sku:down",
            ]  # fmt: skip
            assert dialogs == []  # the name's markup is text, not HTML
            screenshot(page, "debug-toolbar-locks.png", docs=True)
        finally:
            page.close()


def test_nothing_else_in_the_package_imports_the_toolbar() -> None:
    """The toolbar stays optional: every other module imports without it."""
    code = """
import importlib.util, pkgutil, sys, django
django.setup()
import django_redislock
# integrations a project imports only beside their library: checked where it is installed
needs = {
    "django_redislock.once.celery": "celery",
    "django_redislock.once.django_tasks": "django.tasks",
}
for module in pkgutil.walk_packages(django_redislock.__path__, "django_redislock."):
    if module.name in ("django_redislock.debug_toolbar", "django_redislock.otel"):
        continue
    if module.name in needs and importlib.util.find_spec(needs[module.name]) is None:
        continue
    __import__(module.name)
assert "debug_toolbar" not in sys.modules, sorted(m for m in sys.modules if "toolbar" in m)
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_a_lock_handed_over_in_the_queue_has_a_token_without_fencing(
    other_thread: OtherThread,
) -> None:
    """What the panel's token column shows (docs/metrics.md said "only with
    fencing=True"): a plain ``Lock`` that waited and was handed the lock by a
    release got its token in that hand-off, so its acquire reports one."""
    import threading
    import time

    from django_redislock.backend import client as backend
    from tests.support.signals_helper import capture

    holder = Lock("handed:1", timeout=30)
    assert other_thread(holder.acquire)
    queue = backend.key(backend.namespace("default", "redislock"), "handed:1", "queue")
    client = backend.get_client("default")

    def release_once_queued() -> None:
        deadline = time.monotonic() + 30
        while not client.zcard(queue):  # a condition polled, with a deadline
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        other_thread(holder.release)

    releaser = threading.Thread(target=release_once_queued)
    releaser.start()
    try:
        with capture(signals.lock_acquired) as calls, Lock("handed:1", blocking_timeout=30):
            pass
    finally:
        releaser.join(30)
    [acquired] = [c for c in calls if c["name"] == "handed:1" and c["waited"] > 0]
    assert isinstance(acquired["fencing_token"], int) and acquired["fencing_token"] > 0
    page = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    assert "only when created with `fencing=True`" not in page
    assert "handed the lock by a release" in page
