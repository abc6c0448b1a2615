"""End-to-end: the admin dashboard in a real headless Chromium (Playwright).

Skips when Playwright or a Chromium binary is missing, unless
``REDISLOCK_REQUIRE_BROWSER=1`` (CI), which turns the skip into a failure.
The browser is the system's (``apt-get install chromium``), never a download.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redislock import Lock, LockLostError
from tests.support.other_holders import OtherThread

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def _missing(reason: str) -> None:
    if os.environ.get("REDISLOCK_REQUIRE_BROWSER") == "1":
        pytest.fail(f"REDISLOCK_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _chromium() -> str | None:
    configured = os.environ.get("REDISLOCK_CHROMIUM")
    if configured:
        return configured
    for candidate in CHROMIUM_CANDIDATES:
        if os.path.exists(candidate):
            return candidate
    return shutil.which("chromium")


@pytest.fixture
def browser() -> Iterator[Any]:
    """Request it after any fixture that touches the database: Playwright's sync
    API runs an event loop in this thread, and ORM calls under it would be
    refused (or, forced, leave connections that block dropping the test DB)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install playwright)")
    executable = _chromium()
    if executable is None:
        _missing("no Chromium binary (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--headless"],
        )
        try:
            yield browser
        finally:
            browser.close()


def test_dashboard_live_ttl_and_force_release(
    admin_user: Any, live_server: Any, browser: Any, other_thread: OtherThread
) -> None:
    evil = "<script>alert(1)</script>"
    target = Lock("sku:42", timeout=90, auto_renew=False)
    others = [Lock(n, timeout=t, auto_renew=False) for n, t in [
        ("cron:nightly-report", 600), ("cart:7f3a", 45), (evil, 300),
    ]]  # fmt: skip
    for _ in range(2):  # some history for the counters column
        with target:
            assert not other_thread(Lock("sku:42").acquire, blocking=False)
    target.acquire()
    fence = target.fencing_token  # taken on first use: the dashboard shows it from then on
    for lock in others:
        lock.acquire()
    dialogs: list[str] = []
    page = browser.new_page(viewport={"width": 1366, "height": 600})
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        page.goto(f"{live_server.url}/admin/login/?next=/admin/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "password")  # pytest-django's admin_user
        page.click("input[type=submit]")
        page.click("text=Held locks")
        page.wait_for_url("**/admin/django_redislock/heldlock/")

        row = page.locator('#redislock-table tr[data-name="sku:42"]')
        assert row.locator("td.fence").inner_text() == str(fence)
        ttl = row.locator("td.ttl")
        first = float(ttl.inner_text().rstrip("s"))
        assert 80 < first <= 90
        # the TTL ticks down in the browser, between server refreshes
        page.wait_for_function(
            "first => { const c = document.querySelector('tr[data-name=\"sku:42\"] td.ttl');"
            " return c && parseFloat(c.textContent) <= first - 1.0; }",
            arg=first,
            timeout=10_000,
        )
        # and the rows are refreshed from the JSON endpoint
        page.wait_for_function(
            "() => document.getElementById('redislock-table').dataset.refreshed", timeout=15_000
        )
        assert page.locator("#redislock-table tr[data-name]").count() == 4
        assert page.locator("td.name", has_text=evil).inner_text() == evil
        assert dialogs == []

        assert page.locator("th", has_text="Held for").count() == 1
        assert page.locator("#redislock-hot").is_visible()
        screenshot(page, "dashboard-unit.png")

        row.locator("a.button").click()
        page.wait_for_url("**/release/**")
        assert "sku:42" in page.locator("#content").inner_text()
        page.click("text=Yes, release it")
        page.wait_for_url("**/admin/django_redislock/heldlock/")
        assert "Released lock “sku:42”" in page.locator("ul.messagelist").inner_text()
        assert page.locator('#redislock-table tr[data-name="sku:42"]').count() == 0
        assert page.locator("#redislock-table tr[data-name]").count() == 3
        assert dialogs == []
    finally:
        page.close()
        for lock in others:
            lock.release()
    with pytest.raises(LockLostError):
        target.release()


def screenshot(page: Any, name: str, *, docs: bool = False) -> None:
    """Save to ``test-artifacts/``; with ``REDISLOCK_UPDATE_SCREENSHOT=1`` and
    ``docs``, to ``docs/img/`` as well (the docs' pictures come from here)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    if docs and os.environ.get("REDISLOCK_UPDATE_SCREENSHOT") == "1":
        page.screenshot(path=str(DOCS_IMG / name), full_page=True)


def login(page: Any, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/admin/login/?next=/admin/django_redislock/heldlock/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/django_redislock/heldlock/")


#: The layout checks of both themes: the page does not scroll sideways at
#: 1280 px, every row's background spans its last (Release) cell (Django 6.1
#: paints any ``.actions`` element with the page's background), and the
#: breadcrumbs are styled (a background colour, not the page's).
LAYOUT = """() => {
  const rows = [...document.querySelectorAll('#redislock-table tbody tr[data-name]')];
  const crumbs = document.querySelector('.breadcrumbs');
  return {
    overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    rowsCoverCells: rows.every(tr => {
      const last = tr.lastElementChild;
      const paint = getComputedStyle(last).backgroundColor;
      return tr.getBoundingClientRect().right >= last.getBoundingClientRect().right - 0.5
        && (paint === 'rgba(0, 0, 0, 0)' || paint === getComputedStyle(tr).backgroundColor);
    }),
    crumbs: getComputedStyle(crumbs).backgroundColor,
    body: getComputedStyle(document.body).backgroundColor,
    text: getComputedStyle(document.body).color,
  };
}"""


def test_both_themes_and_the_redis_down_state(
    admin_user: Any, live_server: Any, browser: Any, settings: Any
) -> None:
    held = Lock("cron:nightly-report", timeout=600, auto_renew=False)
    held.acquire()
    second = Lock("sku:7", timeout=600, auto_renew=False)
    second.acquire()
    try:
        themes = {}
        for scheme in ("light", "dark"):
            page = browser.new_page(viewport={"width": 1280, "height": 700}, color_scheme=scheme)
            try:
                login(page, live_server.url, "admin", "password")
                assert page.locator('tr[data-name="cron:nightly-report"] td.held').is_visible()
                themes[scheme] = page.evaluate(LAYOUT)
                screenshot(page, f"dashboard-unit-{scheme}.png")
            finally:
                page.close()
    finally:
        held.release()
        second.release()
    for layout in themes.values():
        assert layout["overflow"] <= 0, layout
        assert layout["rowsCoverCells"], layout
        assert layout["crumbs"] != layout["body"], layout
    assert themes["light"]["body"] != themes["dark"]["body"]
    assert themes["light"]["text"] != themes["dark"]["text"]

    from tests.settings import redis_cache
    from tests.support.servers import free_port

    page = browser.new_page(viewport={"width": 1280, "height": 500})
    try:
        login(page, live_server.url, "admin", "password")
        settings.CACHES = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
        page.reload()
        error = page.locator("#redislock-error")
        assert error.is_visible()
        assert "Redis is unreachable or failed" in error.inner_text()
        assert page.locator("#redislock-table").count() == 0
        assert "Nothing is held" not in page.locator("#content").inner_text()
        assert page.locator("#redislock-hot").count() == 0
        screenshot(page, "dashboard-redis-down.png", docs=True)
    finally:
        page.close()


def test_missing_browser_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDISLOCK_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _missing("no Chromium binary")
    monkeypatch.setenv("REDISLOCK_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="REDISLOCK_REQUIRE_BROWSER=1 but no Chromium"):
        _missing("no Chromium binary")


@contextlib.contextmanager
def example_shop(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The example shop in its own ``runserver`` process on a free port, on the
    suite's Redis; yields its URL and a ``manage(*args)`` runner for the same
    database and Redis."""
    from tests.support.servers import free_port

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(REDIS_URL=redis_url, SHOP_DATABASE=str(tmp_path / "shop.sqlite3"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    manage_py = [sys.executable, str(ROOT / "example_project" / "manage.py")]

    def manage(*args: str, **kwargs: Any) -> Any:
        return subprocess.Popen([*manage_py, *args], env=env, **kwargs)

    for args in (("migrate", "--noinput", "-v", "0"), ("seed_shop",)):
        assert manage(*args, stdout=subprocess.DEVNULL).wait(120) == 0
    port = free_port()
    server = manage("runserver", "--noreload", f"127.0.0.1:{port}", stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:  # runserver answers once it listens
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, "runserver exited"
                assert time.monotonic() < deadline, "runserver did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", manage
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.django_db(transaction=False)
def test_dashboard_under_shop_load(tmp_path: Path, redis_url: str, browser: Any) -> None:
    """The docs' screenshots: the example shop's dashboard while ``shop_load``
    runs 8 buyers in another process (holders with what they run, queues, hot
    names with their charts), in the light and dark themes. The shop has its
    own SQLite database, so the run on PostgreSQL skips it."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the example shop runs on its own SQLite database: once per CI run")
    # the docs' pictures come from a longer run (REDISLOCK_SHOP_LOAD_SECONDS=150), so
    # the charts show a few minutes; the test itself needs ten seconds of load, and
    # five more for the two logins on a loaded CI machine
    seconds = int(os.environ.get("REDISLOCK_SHOP_LOAD_SECONDS", "15"))
    with example_shop(tmp_path, redis_url) as (url, manage):
        started = time.monotonic()
        load = manage("shop_load", "--seconds", str(seconds), "--buyers", "8",
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            pages = {}
            for scheme in ("light", "dark"):
                page = pages[scheme] = browser.new_page(
                    viewport={"width": 1280, "height": 800}, color_scheme=scheme
                )
                login(page, url, "admin", "redislock-demo")
            page = pages["light"]
            # wait until the queue behind the hot SKU shows with its waiters'
            # context, in the page as the server renders it (the page's live
            # refresh of it is test_e2e_dashboard.py's; it failed here once a
            # semaphore was held, test_a_refresh_shows_a_kind_without_counters)
            deadline = time.monotonic() + 30
            while not page.locator('tr[data-name="sku:1"] ol.queue li .runs').count():
                assert time.monotonic() < deadline, "sku:1 never showed its queue"
                assert load.poll() is None, "the load ended before sku:1 showed its queue"
                page.goto(f"{url}/admin/django_redislock/heldlock/")
            assert "POST /buy/1/" in page.locator('tr[data-name="sku:1"] td.holders').inner_text()
            assert "buyer-" in page.locator('tr[data-name="sku:1"] td.waiters').inner_text()
            while time.monotonic() < started + seconds - 8:  # history to chart
                page.wait_for_timeout(1000)
            for scheme, page in pages.items():
                deadline = time.monotonic() + 20
                while True:  # the buyers' process writes its history once a second
                    page.goto(f"{url}/admin/django_redislock/heldlock/?window=5")
                    if page.locator('#redislock-hot-table tr[data-name="sku:1"]').count():
                        break
                    assert time.monotonic() < deadline, "sku:1 never showed as hot"
                    page.wait_for_timeout(500)
                assert page.locator("#redislock-hot svg.redislock-chart rect.bar").count() > 0
                assert (
                    page.locator('tr[data-name="report:daily"] .runs')
                    .inner_text()
                    .startswith(f"shop_load: 8 buyers for {seconds} s")
                )
                name = "dashboard.png" if scheme == "light" else "dashboard-dark.png"
                screenshot(page, name, docs=True)
            # the open page swaps in a fresh hot-names panel every third refresh
            page = pages["light"]
            page.wait_for_function(
                "() => document.getElementById('redislock-hot-body').dataset.refreshed",
                timeout=20_000,
            )
            assert page.locator('#redislock-hot-table tr[data-name="sku:1"]').count() == 1
            for page in pages.values():
                page.close()
        finally:
            output = load.communicate(timeout=60)[0].decode()
        assert load.returncode == 0, output
        assert "Done:" in output
