"""The admin edit lease on the server (issue 47): who gets the form, and the fenced save.

Django's test client against the suite's redis-server; each user is a client
of their own, so two clients are two staff members (or one, in two tabs).
The browser's side (the page's script, the beacon) is ``test_edit_lease_browser.py``.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client

from django_redislock import LockBackendError
from django_redislock.admin import EditLeaseMixin
from django_redislock.editing import lease
from tests.models import Brochure, BrochurePage, FencedRecord
from tests.support import edit_lease_admin

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.support.edit_lease_admin"),
]

CHANGE_URL = "/leased/tests/brochure/{}/change/"
NAME = "admin-edit:tests.brochure:{}"
TICKET = re.compile(r'name="_redislock_edit_ticket" value="([^"]+)"')
FENCE = re.compile(r'name="_redislock_edit_fence" value="(\d+)"')


def staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    codenames = [f"{action}_{model}" for action in ("add", "change", "view", "delete")
                 for model in ("brochure", "brochurepage")] + list(perms)  # fmt: skip
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def brochure() -> Brochure:
    item = Brochure.objects.create(title="Spring", body="flowers")
    BrochurePage.objects.create(brochure=item, text="page one")
    return item


@pytest.fixture
def ana() -> Client:
    return client_for(staff("ana"))


@pytest.fixture
def bob() -> Client:
    return client_for(staff("bob", "take_over_edit_lease"))


class Page:
    """A change form as one client has it open: its ticket and fencing token."""

    def __init__(self, client: Client, pk: int, site: str = "leased") -> None:
        self.client, self.pk = client, pk
        self.url = CHANGE_URL.format(pk).replace("/leased/", f"/{site}/")
        self.response = client.get(self.url)
        assert self.response.status_code == 200
        self.html = self.response.content.decode()
        ticket, fence = TICKET.search(self.html), FENCE.search(self.html)
        self.ticket = ticket.group(1) if ticket else None
        self.fence = fence.group(1) if fence else None

    @property
    def status(self) -> str:
        return str(self.response.context["edit_lease"]["state"].status)

    def post(self, **fields: str) -> Any:
        data = {
            "title": "Spring", "body": "flowers",
            "pages-TOTAL_FORMS": "1", "pages-INITIAL_FORMS": "1",
            "pages-MIN_NUM_FORMS": "0", "pages-MAX_NUM_FORMS": "1000",
            "pages-0-id": str(BrochurePage.objects.get(brochure_id=self.pk).pk),
            "pages-0-brochure": str(self.pk), "pages-0-text": "page one",
            "_save": "Save",
        }  # fmt: skip
        if self.ticket is not None:
            data.update(_redislock_edit_ticket=self.ticket, _redislock_edit_fence=self.fence or "")
        data.update(fields)
        return self.client.post(self.url, data)

    def renew(self) -> Any:
        return self.client.post(
            f"{self.url.removesuffix('change/')}edit-lease/renew/",
            {"_redislock_edit_ticket": self.ticket or ""},
        )


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


def holder_of(pk: int) -> lease.Editor | None:
    found = lease.holder(NAME.format(pk))
    return found[1] if found else None


def test_opening_the_form_takes_the_lease_and_saving_gives_it_up(
    ana: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk)
    assert page.status == "held" and page.ticket and page.fence
    assert 'id="redislock-edit-lease-config"' in page.html
    editor = holder_of(brochure.pk)
    assert editor is not None and editor.username == "ana"
    response = page.post(title="Spring sale")
    assert response.status_code == 302
    brochure.refresh_from_db()
    assert brochure.title == "Spring sale"
    assert holder_of(brochure.pk) is None  # saved: the lease is given up


def test_another_user_gets_a_read_only_form_with_who_and_since(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    Page(ana, brochure.pk)
    carol = client_for(staff("carol"))  # no take-over permission
    for client, can_take_over in ((bob, True), (carol, False)):
        page = Page(client, brochure.pk)
        assert page.status == "busy" and page.ticket is None
        assert re.search(r"Being edited by ana since \d", page.html), page.html
        assert 'name="_save"' not in page.html  # Django's view-only form
        assert 'name="title"' not in page.html and 'name="pages-0-text"' not in page.html
        assert ('id="redislock-take-over"' in page.html) is can_take_over
    assert holder_of(brochure.pk).username == "ana"  # type: ignore[union-attr]


def test_a_take_over_is_logged_and_the_previous_page_is_told_and_refused(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    stale = Page(ana, brochure.pk)
    busy = Page(bob, brochure.pk)
    ana_id = str(User.objects.get(username="ana").pk)
    response = bob.post(
        f"{busy.url.removesuffix('change/')}edit-lease/take-over/", {"holder": ana_id}
    )
    assert response.status_code == 302
    assert holder_of(brochure.pk).username == "bob"  # type: ignore[union-attr]
    entry = LogEntry.objects.get(action_flag=CHANGE, object_id=str(brochure.pk))
    assert (
        entry.user.username == "bob" and "Took over the edit lease from ana" in entry.change_message
    )
    mine = Page(bob, brochure.pk)
    assert mine.status == "held"  # the take-over's lease, handed to the page it redirected to

    renewed = stale.renew()
    assert renewed.status_code == 409
    assert (
        renewed.json()["status"] == "lost" and "bob took over editing" in renewed.json()["message"]
    )
    refused = stale.post(title="ana's late edit")
    assert refused.status_code == 302
    assert any("bob took over editing" in m and "not saved" in m for m in messages_of(refused))
    brochure.refresh_from_db()
    assert brochure.title == "Spring"
    assert holder_of(brochure.pk).username == "bob"  # type: ignore[union-attr]


def test_a_take_over_without_the_permission_is_refused(ana: Client, brochure: Brochure) -> None:
    Page(ana, brochure.pk)
    carol = client_for(staff("carol"))
    response = carol.post(f"/leased/tests/brochure/{brochure.pk}/edit-lease/take-over/",
                          {"holder": str(User.objects.get(username="ana").pk)})  # fmt: skip
    assert response.status_code == 403
    assert holder_of(brochure.pk).username == "ana"  # type: ignore[union-attr]


def test_a_late_save_with_a_used_ticket_or_another_fence_is_refused(
    ana: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk)
    first = page.ticket
    assert page.renew().json()["status"] == "held"  # the renewal used the page's ticket
    page.ticket = first
    refused = page.post(title="from the old ticket")
    assert any("not saved" in m for m in messages_of(refused))
    again = Page(ana, brochure.pk)  # the lease is still ana's, elsewhere: another tab
    assert again.status == "elsewhere"
    brochure.refresh_from_db()
    assert brochure.title == "Spring"


def test_a_save_whose_fence_is_not_the_leases_is_refused(ana: Client, brochure: Brochure) -> None:
    page = Page(ana, brochure.pk)
    page.fence = str(int(page.fence or 0) - 1)
    refused = page.post(title="wrong fence")
    assert any("not saved" in m for m in messages_of(refused))
    brochure.refresh_from_db()
    assert brochure.title == "Spring"


def test_a_save_after_the_lease_ran_out_is_refused(ana: Client, brochure: Brochure) -> None:
    page = Page(ana, brochure.pk)
    lease.clear(NAME.format(brochure.pk), str(User.objects.get(username="ana").pk))  # ran out
    refused = page.post(title="too late")
    assert any("ran out" in m for m in messages_of(refused)), messages_of(refused)
    brochure.refresh_from_db()
    assert brochure.title == "Spring"


def in_thread(work: Any) -> threading.Thread:
    """``work`` started in a thread that closes its database connections when done."""
    from django.db import connections

    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def queued(name: str) -> None:
    """Wait until someone waits in line for ``name`` (the server's queue says so)."""
    from django_redislock.ops import inspection
    from django_redislock.ops.common import connect

    client, prefix = connect()
    deadline = time.monotonic() + 30
    while not any(info.waiters for info in inspection.describe(client, prefix, name)):
        assert time.monotonic() < deadline, f"nobody queued for {name}"
        time.sleep(0.01)


def test_a_take_over_waits_for_a_save_being_written(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    """The race: bob takes over while ana's save is inside its transaction.
    The take-over waits on the object's save lock, so ana's save (made while
    she held the lease) commits whole, and the take-over follows it; no
    write of a lease that was already taken over can happen."""
    page = Page(ana, brochure.pk)
    busy = Page(bob, brochure.pk)
    entered, proceed = threading.Event(), threading.Event()
    edit_lease_admin.SAVE_GATE.update(entered=entered, proceed=proceed)
    results: dict[str, Any] = {}
    try:
        saver = in_thread(lambda: results.update(save=page.post(title="ana's save")))
        assert entered.wait(30)
        edit_lease_admin.SAVE_GATE.clear()
        taker = in_thread(lambda: results.update(take=bob.post(
            f"{busy.url.removesuffix('change/')}edit-lease/take-over/",
            {"holder": str(User.objects.get(username="ana").pk)})))  # fmt: skip
        queued(lease.SAVE_PREFIX + f"tests.brochure:{brochure.pk}")  # bob waits on ana's save
        assert holder_of(brochure.pk).username == "ana"  # type: ignore[union-attr]
    finally:
        proceed.set()
    saver.join(30)
    taker.join(30)
    assert results["save"].status_code == 302 and not any(
        "not saved" in m for m in messages_of(results["save"])
    )
    brochure.refresh_from_db()
    assert brochure.title == "ana's save"
    # ana's save gave the lease up, so bob's take-over found it free: no one to log
    assert holder_of(brochure.pk).username == "bob"  # type: ignore[union-attr]
    assert not LogEntry.objects.filter(change_message__contains="Took over").exists()


def test_a_renewal_whose_answer_was_lost_is_told_as_it_may_be(
    ana: Client, brochure: Brochure
) -> None:
    """A renewal reached the server and rotated the ticket, but its answer
    never reached the page: the page's next renewal sends the old ticket.
    The server cannot tell that from a take-over in the user's other tab,
    and the message says both, not only "another tab"."""
    page = Page(ana, brochure.pk)
    assert page.renew().json()["status"] == "held"  # its answer "lost": page.ticket kept
    answer = page.renew()
    assert answer.status_code == 409
    message = answer.json()["message"]
    assert "another tab or window" in message
    assert "missed the answer to its last renewal" in message
    assert "Your changes cannot be saved" in message


def test_the_same_user_in_two_tabs_is_never_locked_out(ana: Client, brochure: Brochure) -> None:
    first = Page(ana, brochure.pk)
    second = Page(ana, brochure.pk)
    assert second.status == "elsewhere"
    assert "You are editing this in another tab or window" in second.html
    assert 'id="redislock-take-over"' in second.html  # no permission needed for one's own
    ana_id = str(User.objects.get(username="ana").pk)
    ana.post(f"{second.url.removesuffix('change/')}edit-lease/take-over/", {"holder": ana_id})
    third = Page(ana, brochure.pk)
    assert third.status == "held"
    assert "another tab" in first.renew().json()["message"]
    assert not LogEntry.objects.exists()  # one's own lease: nothing to log
    assert third.post(title="from the tab that took over").status_code == 302
    brochure.refresh_from_db()
    assert brochure.title == "from the tab that took over"


def test_errors_keep_the_lease_and_save_and_continue_hands_it_on(
    ana: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk)
    invalid = page.post(title="")
    assert invalid.status_code == 200  # the form again, with its errors
    html = invalid.content.decode()
    ticket = TICKET.search(html)
    assert ticket and ticket.group(1) != page.ticket  # the lease, detached again
    page.ticket = ticket.group(1)
    saved = page.post(title="Summer", _continue="1")
    assert saved.status_code == 302
    again = Page(ana, brochure.pk)
    assert again.status == "held"  # handed to the page "save and continue" opens
    brochure.refresh_from_db()
    assert brochure.title == "Summer"


def test_inlines_are_read_only_and_saved_under_the_lease(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk)
    busy = Page(bob, brochure.pk)
    assert "page one" in busy.html and 'name="pages-0-text"' not in busy.html
    assert page.post(**{"pages-0-text": "page one, edited"}).status_code == 302
    assert BrochurePage.objects.get(brochure=brochure).text == "page one, edited"


def test_save_as_new_needs_no_lease_of_the_original(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk)
    response = page.post(title="Spring copy", _saveasnew="1", **{"pages-0-id": ""})
    assert response.status_code == 302
    assert Brochure.objects.filter(title="Spring copy").exists()
    brochure.refresh_from_db()
    assert brochure.title == "Spring"
    assert holder_of(brochure.pk) is None  # the page left: its lease given up
    Page(ana, brochure.pk)
    busy = Page(bob, brochure.pk)  # a copy from a read-only page: writes no leased object
    copied = busy.post(title="bob's copy", _saveasnew="1", **{"pages-0-id": ""})
    assert copied.status_code == 302 and Brochure.objects.filter(title="bob's copy").exists()


def test_a_custom_change_view_and_template_keep_the_lease(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    page = Page(ana, brochure.pk, site="custom")
    assert page.status == "held" and 'id="custom-note">custom view<' in page.html
    busy = Page(bob, brochure.pk, site="custom")
    assert busy.status == "busy" and "Being edited by ana" in busy.html


def test_the_change_list_and_other_admins_are_untouched(ana: Client, brochure: Brochure) -> None:
    assert ana.get("/leased/tests/brochure/").status_code == 200
    assert holder_of(brochure.pk) is None
    record = FencedRecord.objects.create(value="x")
    admin_user = User.objects.create_superuser("root", password="pw")
    root = client_for(admin_user)
    response = root.get(f"/leased/tests/fencedrecord/{record.pk}/change/")
    assert response.status_code == 200 and "redislock-edit-lease" not in response.content.decode()
    assert lease.holder(f"admin-edit:tests.fencedrecord:{record.pk}") is None


def test_the_release_endpoint_gives_the_lease_up(ana: Client, brochure: Brochure) -> None:
    page = Page(ana, brochure.pk)
    response = ana.post(f"{page.url.removesuffix('change/')}edit-lease/release/",
                        {"_redislock_edit_ticket": page.ticket or ""})  # fmt: skip
    assert response.status_code == 200 and holder_of(brochure.pk) is None


def test_a_leaving_page_s_give_up_on_an_unreachable_redis_is_logged_not_raised(
    ana: Client, brochure: Brochure, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    page = Page(ana, brochure.pk)

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise LockBackendError("Redis is unreachable")

    monkeypatch.setattr(lease, "holder", unreachable)
    with caplog.at_level("INFO", logger="django_redislock.editing.views"):
        response = ana.post(f"{page.url.removesuffix('change/')}edit-lease/release/",
                            {"_redislock_edit_ticket": page.ticket or ""})  # fmt: skip
    assert response.status_code == 200  # the page is leaving: nobody to show an error to
    assert "Could not give up the edit lease" in caplog.text
    assert "Redis is unreachable" in caplog.text
    monkeypatch.undo()
    assert holder_of(brochure.pk) is not None  # left to run out by itself


def test_non_staff_users_are_refused_clearly(brochure: Brochure) -> None:
    user = User.objects.create_user("dan", password="pw")
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["change_brochure", "view_brochure"])
    )
    response = client_for(user).get(f"/open/tests/brochure/{brochure.pk}/change/")
    assert response.status_code == 403
    assert holder_of(brochure.pk) is None


def test_bad_configuration_is_a_clear_error() -> None:
    from django.contrib import admin

    class Slow(EditLeaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
        edit_lease_timeout = 1

    with pytest.raises(ImproperlyConfigured, match="at least 3 seconds"):
        Slow(Brochure, admin.site)

    class Bad(EditLeaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
        edit_lease_timeout = "long"  # type: ignore[assignment]

    with pytest.raises(ImproperlyConfigured, match="edit_lease_timeout"):
        Bad(Brochure, admin.site)

    class Keyless:  # what the mixin reads of a model that has no primary key
        _meta = SimpleNamespace(pk=None, abstract=False, label="tests.Keyless")

    with pytest.raises(ImproperlyConfigured, match=r"tests\.Keyless has no primary key"):
        type("Fine", (EditLeaseMixin, admin.ModelAdmin), {})(Keyless, admin.site)

    class Inline(EditLeaseMixin, admin.TabularInline):  # type: ignore[type-arg]
        model = BrochurePage

    with pytest.raises(ImproperlyConfigured, match="goes on a ModelAdmin"):
        Inline(Brochure, admin.site)


def test_an_edit_lease_is_described_for_the_operator_tools(ana: Client, brochure: Brochure) -> None:
    Page(ana, brochure.pk)
    out = io.StringIO()
    call_command("locks", stdout=out)
    listed = re.search(rf"admin edit lease: ana editing tests\.brochure {brochure.pk} since "
                       r"\d\d:\d\d:\d\d UTC", out.getvalue())  # fmt: skip
    assert listed, out.getvalue()
    out = io.StringIO()
    call_command("locks", "inspect", NAME.format(brochure.pk), stdout=out)
    assert "admin edit lease: ana editing" in out.getvalue()
    out = io.StringIO()
    call_command("locks", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())
    edit = row["holders"][0]["edit_lease"]
    assert (edit["model"], edit["pk"], edit["user"]) == ("tests.brochure", str(brochure.pk), "ana")
    found = lease.holder(NAME.format(brochure.pk))
    assert found is not None
    from django_redislock.ops.common import connect
    from django_redislock.ops.inspection import describe

    client, prefix = connect()
    (info,) = describe(client, prefix, NAME.format(brochure.pk))
    parsed = lease.parse(info.name, info.holders[0].holder)
    assert parsed is not None
    assert (parsed.model, parsed.pk, parsed.editor.username) == (
        "tests.brochure",
        str(brochure.pk),
        "ana",
    )


@pytest.fixture(autouse=True)
def _no_gate() -> Iterator[None]:
    yield
    edit_lease_admin.SAVE_GATE.clear()


def test_with_redis_unreachable_the_form_is_read_only_and_saves_are_refused(
    ana: Client, brochure: Brochure, settings: Any
) -> None:
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    page = Page(ana, brochure.pk)
    settings.CACHES = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    down = Page(ana, brochure.pk)
    assert down.status == "unavailable" and "Redis is unreachable" in down.html
    assert 'name="title"' not in down.html
    refused = page.post(title="while Redis is down")
    assert any("Redis is unreachable" in m and "not saved" in m for m in messages_of(refused))
    brochure.refresh_from_db()
    assert brochure.title == "Spring"


def test_a_take_over_of_a_lease_that_changed_hands_takes_nothing(
    ana: Client, bob: Client, brochure: Brochure
) -> None:
    """Bob's page showed ana; carol took over since: bob's click leaves carol's lease alone."""
    Page(ana, brochure.pk)
    busy = Page(bob, brochure.pk)
    carol = client_for(staff("carol", "take_over_edit_lease"))
    ana_id = str(User.objects.get(username="ana").pk)
    take_over = f"{busy.url.removesuffix('change/')}edit-lease/take-over/"
    carol.post(take_over, {"holder": ana_id})
    response = bob.post(take_over, {"holder": ana_id})
    assert any("nothing was taken over" in m for m in messages_of(response))
    assert holder_of(brochure.pk).username == "carol"  # type: ignore[union-attr]
    assert LogEntry.objects.filter(user__username="bob").count() == 0
