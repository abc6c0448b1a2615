"""End-to-end: the admin dashboard in a real headless Chromium (Playwright).

Skips when Playwright or a Chromium binary is missing, unless
``REDISLOCK_REQUIRE_BROWSER=1`` (CI), which turns the skip into a failure.
The browser is the system's (``apt-get install chromium``), never a download.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redislock import Lock, LockLostError

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"
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
    admin_user: Any, live_server: Any, browser: Any
) -> None:
    evil = "<script>alert(1)</script>"
    target = Lock("sku:42", timeout=90, auto_renew=False)
    others = [Lock(n, timeout=t, auto_renew=False) for n, t in [
        ("cron:nightly-report", 600), ("cart:7f3a", 45), (evil, 300),
    ]]  # fmt: skip
    for _ in range(2):  # some history for the counters column
        with target:
            assert not Lock("sku:42").acquire(blocking=False)
    target.acquire()
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

        row = page.locator('tr[data-name="sku:42"]')
        assert row.locator("td.fence").inner_text() == str(target.fencing_token)
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
        assert page.locator("tr[data-name]").count() == 4
        assert page.locator("td.name", has_text=evil).inner_text() == evil
        assert dialogs == []

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        if os.environ.get("REDISLOCK_UPDATE_SCREENSHOT") == "1":
            page.screenshot(path=str(SCREENSHOT), full_page=True)

        row.locator("a.button").click()
        page.wait_for_url("**/release/**")
        assert "sku:42" in page.locator("#content").inner_text()
        page.click("text=Yes, release it")
        page.wait_for_url("**/admin/django_redislock/heldlock/")
        assert "Released lock “sku:42”" in page.locator("ul.messagelist").inner_text()
        assert page.locator('tr[data-name="sku:42"]').count() == 0
        assert page.locator("tr[data-name]").count() == 3
        assert dialogs == []
    finally:
        page.close()
        for lock in others:
            lock.release()
    with pytest.raises(LockLostError):
        target.release()


def test_missing_browser_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDISLOCK_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _missing("no Chromium binary")
    monkeypatch.setenv("REDISLOCK_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="REDISLOCK_REQUIRE_BROWSER=1 but no Chromium"):
        _missing("no Chromium binary")
