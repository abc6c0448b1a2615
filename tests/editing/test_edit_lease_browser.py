"""The admin edit lease in a real headless Chromium, on the example shop's SKU admin (issue 47).

Two browser contexts are two staff members (ana and bob); a second page in
ana's context is ana in a second tab. The shop runs in its own ``runserver``
process on the suite's Redis (``tests/example/test_e2e.py``'s
``example_shop``), so the page's script, its renewals and its beacon go
through a real server. The page's clock is Playwright's: a renewal is
brought forward by fast-forwarding it, never waited for. The docs'
screenshots (``docs/edit-lease.md``) come from here.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.example.test_e2e import browser, example_shop, screenshot

__all__ = ["browser"]  # the fixture, shared with test_e2e.py

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=False),
]

#: The shop's SKU admin renews every third of its 120 s lease.
RENEW_MS = 40_000
USERS = """
from django.contrib.auth.models import Permission, User
perms = Permission.objects.filter(codename__in=[
    "view_sku", "change_sku", "add_sku", "take_over_edit_lease"])
for name in ("ana", "bob"):
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(perms)
from example_project.shop.models import SKU
SKU.objects.create(code="tote-bag", title="Tote bag", price="12.00", stock=5)
"""


def sign_in(context: Any, url: str, username: str) -> None:
    page = context.new_page()
    page.goto(f"{url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{url}/admin/")
    page.close()


def open_sku(context: Any, url: str, pk: int) -> Any:
    page = context.new_page()
    page.set_viewport_size({"width": 1100, "height": 640})
    page.clock.install()  # runs on as usual until fast-forwarded
    page.goto(f"{url}/admin/shop/sku/{pk}/change/")
    page.wait_for_selector("#redislock-edit-lease")
    return page


def status(page: Any) -> str:
    return str(page.get_attribute("#redislock-edit-lease", "data-status"))


def banner(page: Any) -> str:
    return str(page.inner_text("#redislock-edit-lease")).strip()


def renew_now(page: Any) -> None:
    """Bring the page's next renewal forward, and wait until it was answered."""
    done = int(page.get_attribute("#redislock-edit-lease", "data-renewals") or 0)
    page.clock.fast_forward(RENEW_MS + 1_000)
    page.wait_for_function(
        "n => Number(document.getElementById('redislock-edit-lease').dataset.renewals || 0) > n",
        arg=done,
        timeout=15_000,
    )


def title_of(database: Path, pk: int) -> str:
    with contextlib.closing(sqlite3.connect(database)) as db:
        (title,) = db.execute("SELECT title FROM shop_sku WHERE id = ?", (pk,)).fetchone()
    return str(title)


def test_two_editors_take_over_stale_save_two_tabs_and_a_closed_tab(
    tmp_path: Path, redis_url: str, browser: Any
) -> None:
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the example shop runs on its own SQLite database: once per CI run")
    database = tmp_path / "shop.sqlite3"
    with example_shop(tmp_path, redis_url) as (url, manage):
        assert manage("shell", "-c", USERS, stdout=subprocess.DEVNULL).wait(120) == 0
        ana, bob = browser.new_context(), browser.new_context()
        try:
            sign_in(ana, url, "ana")
            sign_in(bob, url, "bob")
            _banner_read_only_and_take_over(ana, bob, url, database)
            _the_previous_editor_is_told(ana, bob, url)
            _one_user_in_two_tabs(ana, url)
            _a_closed_tab_ends_the_lease(ana, bob, url)
        finally:
            ana.close()
            bob.close()


def _banner_read_only_and_take_over(ana: Any, bob: Any, url: str, database: Path) -> None:
    original = title_of(database, 1)
    editing = open_sku(ana, url, 1)
    assert status(editing) == "held"
    assert "You are editing this SKU" in banner(editing)
    editing.fill("#id_title", "Concert ticket (ana's late edit)")
    screenshot(editing, "edit-lease-editing.png", docs=True)

    _the_dashboard_shows_it(bob, url)
    watching = open_sku(bob, url, 1)
    assert status(watching) == "busy"
    assert re.search(r"Being edited by ana since \d", banner(watching)), banner(watching)
    assert watching.locator("#id_title").count() == 0  # the form, read only
    assert watching.locator("input[name=_save]").count() == 0
    screenshot(watching, "edit-lease-busy.png", docs=True)

    watching.click("#redislock-take-over")
    watching.wait_for_selector("#id_title")
    assert status(watching) == "held"
    assert "You took over editing" in watching.inner_text(".messagelist .success")

    # ana's page has not renewed since: its save goes out with the old ticket, and is refused
    editing.click("input[name=_save]")
    editing.wait_for_selector(".messagelist .error")
    message = editing.inner_text(".messagelist .error")
    assert "Bob took over editing" in message and "Your changes were not saved." in message
    assert status(editing) == "busy"  # the form again, bob's, read only
    assert title_of(database, 1) == original
    screenshot(editing, "edit-lease-refused.png", docs=True)
    editing.close()
    watching.close()


def _the_dashboard_shows_it(context: Any, url: str) -> None:
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 500})
    page.goto(f"{url}/admin/django_redislock/heldlock/")
    holders = page.locator('tr[data-name="admin-edit:shop.sku:1"] td.holders')
    assert re.search(r"admin edit lease: ana editing shop\.sku 1 since \d\d:\d\d:\d\d UTC",
                     holders.inner_text()), holders.inner_text()  # fmt: skip
    screenshot(page, "edit-lease-dashboard.png", docs=True)
    page.close()


def _the_previous_editor_is_told(ana: Any, bob: Any, url: str) -> None:
    """The page of an editor whose lease was taken over says so at its next renewal."""
    editing = open_sku(bob, url, 2)
    renew_now(editing)
    assert status(editing) == "held"  # a renewal that kept it
    taking = open_sku(ana, url, 2)
    taking.click("#redislock-take-over")
    taking.wait_for_selector("#id_title")
    renew_now(editing)
    assert status(editing) == "lost"
    assert "ana took over editing" in banner(editing)
    assert editing.locator("input[name=_save]").is_disabled()
    screenshot(editing, "edit-lease-lost.png", docs=True)
    editing.close(run_before_unload=True)
    taking.close(run_before_unload=True)


def _one_user_in_two_tabs(ana: Any, url: str) -> None:
    first = open_sku(ana, url, 3)
    second = open_sku(ana, url, 3)
    assert status(second) == "elsewhere"
    assert "You are editing this in another tab or window" in banner(second)
    screenshot(second, "edit-lease-second-tab.png", docs=True)
    second.click("#redislock-take-over")  # "Edit here instead": one's own, no permission needed
    second.wait_for_selector("#id_title")
    assert status(second) == "held"
    renew_now(first)
    assert status(first) == "lost" and "in another tab or window" in banner(first)
    first.close(run_before_unload=True)
    # a reload: the old page's release lands after the new page's request (Chromium
    # sends it once the new page's answer is in); the new page, "in another tab",
    # looks again, and reloads as the editor's once the lease is free
    second.reload()
    second.wait_for_function(
        "() => (document.getElementById('redislock-edit-lease') || {dataset: {}})"
        ".dataset.status === 'held'",
        timeout=15_000,
    )
    second.close(run_before_unload=True)


def _a_closed_tab_ends_the_lease(ana: Any, bob: Any, url: str) -> None:
    editing = open_sku(ana, url, 4)
    assert status(editing) == "held"
    watching = open_sku(bob, url, 4)
    assert status(watching) == "busy"
    editing.close(run_before_unload=True)  # the page's pagehide sends the release beacon
    deadline = time.monotonic() + 15
    while status(watching) != "held":  # the beacon lands after the tab is gone
        assert time.monotonic() < deadline, "the closed tab's lease was never given up"
        watching.wait_for_timeout(200)
        watching.reload()
    watching.close()
