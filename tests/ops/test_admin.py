from __future__ import annotations

import re
from typing import Any

import pytest
import redis
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.test import Client, override_settings
from django.urls import reverse

from django_redislock import Lock, LockLostError
from django_redislock.holds import counters as tally
from tests.support import lockfill
from tests.support.other_holders import OtherThread

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django_redislock/heldlock/"
DATA = DASHBOARD + "data/"
RELEASE = DASHBOARD + "release/"


def staff(username: str = "staff", *, can_release: bool = False) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    if can_release:
        user.user_permissions.add(Permission.objects.get(codename="release_lock"))
    return user


def client_for(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_urls_are_the_admin_urls() -> None:
    assert reverse("admin:django_redislock_heldlock_changelist") == DASHBOARD
    assert reverse("admin:django_redislock_heldlock_data") == DATA
    assert reverse("admin:django_redislock_heldlock_release") == RELEASE


def test_permission_row_exists_from_the_migration() -> None:
    perm = Permission.objects.get(codename="release_lock")
    assert perm.content_type.app_label == "django_redislock"
    # default_permissions = (): no add/change/delete/view rows for a model with no table
    # and the edit lease's take-over permission (migration 0002)
    assert sorted(
        Permission.objects.filter(content_type=perm.content_type).values_list("codename", flat=True)
    ) == ["release_lock", "take_over_edit_lease"]


def test_index_links_to_dashboard_for_staff(admin_client: Client) -> None:
    body = admin_client.get("/admin/").content.decode()
    assert f'href="{DASHBOARD}"' in body
    assert "Held locks" in body
    plain_staff = client_for(staff())
    assert f'href="{DASHBOARD}"' in plain_staff.get("/admin/").content.decode()


@pytest.mark.parametrize("url", [DASHBOARD, DATA, RELEASE + "?name=x&kind=lock"])
def test_anonymous_and_non_staff_are_sent_to_login(url: str) -> None:
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    user = User.objects.create_user("customer", password="pw")
    response = client_for(user).get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_dashboard_lists_held_lock_with_fence_and_ttl(admin_client: Client) -> None:
    with Lock("sku:42", timeout=30) as lock:
        fence = lock.fencing_token
        response = admin_client.get(DASHBOARD)
    body = response.content.decode()
    assert response.status_code == 200
    link = f'<a href="{DASHBOARD}name/sku:42/">sku:42</a>'
    assert f'<td class="name">{link}</td>' in body
    assert f'<td class="fence">{fence}</td>' in body
    ttl = re.search(r'data-ttl="([0-9.]+)"', body)
    assert ttl is not None
    assert 0 < float(ttl.group(1)) <= 30
    assert 'class="breadcrumbs"' in body
    assert "django_redislock/dashboard.js" in body
    assert RELEASE + "?name=sku%3A42&amp;kind=lock" in body  # the superuser may release


def test_dashboard_for_staff_without_permission_has_no_release(client: Client) -> None:
    with Lock("sku:1"):
        response = client_for(staff()).get(DASHBOARD)
        data = client_for(staff("other")).get(DATA).json()
    assert "sku:1" in response.content.decode()
    assert RELEASE not in response.content.decode()
    assert data["can_release"] is False


def test_json_endpoint(admin_client: Client) -> None:
    with Lock("sku:7") as lock:
        fence = lock.fencing_token
        response = admin_client.get(DATA)
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]  # admin_view: never cached
    data = response.json()
    assert data["count"] == 1
    assert data["can_release"] is True
    row = data["results"][0]
    assert row["name"] == "sku:7"
    assert row["fencing_token"] == fence
    assert isinstance(row["counters"], dict)
    assert row["release_url"] == RELEASE + "?name=sku%3A7&kind=lock"
    assert admin_client.post(DATA).status_code == 405


def test_names_are_escaped(admin_client: Client) -> None:
    evil = "<script>alert(1)</script>"
    with Lock(evil):
        body = admin_client.get(DASHBOARD).content.decode()
        confirm = admin_client.get(RELEASE, {"name": evil, "kind": "lock"}).content.decode()
        data = admin_client.get(DATA).json()
    for page in (body, confirm):
        assert evil not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert data["results"][0]["name"] == evil  # JSON carries data; the page sets textContent


def test_search_and_pagination(admin_client: Client, redis_client: redis.Redis) -> None:
    lockfill.fill(redis_client, 250, name="job:{:03d}")
    lockfill.fill(redis_client, 3, name="sku:[{}]*")
    data = admin_client.get(DATA).json()
    assert (data["count"], data["pages"], len(data["results"])) == (253, 3, 100)
    assert data["results"][0]["name"] == "job:000"
    last = admin_client.get(DATA, {"page": 3}).json()
    assert len(last["results"]) == 53
    assert admin_client.get(DATA, {"page": 99}).json()["page"] == 3
    found = admin_client.get(DATA, {"q": "job:12"}).json()
    assert [r["name"] for r in found["results"]] == [f"job:12{i}" for i in range(10)]
    # glob characters in the search are literal
    assert [r["name"] for r in admin_client.get(DATA, {"q": "[1]*"}).json()["results"]] == [
        "sku:[1]*"
    ]
    body = admin_client.get(DASHBOARD, {"page": 2}).content.decode()
    assert "page 2 of 3" in body
    assert "?page=1" in body
    assert "?page=3" in body


def test_release_needs_confirmation_then_post(redis_client: redis.Redis) -> None:
    user = staff(can_release=True)
    client = client_for(user, csrf=True)
    lock = Lock("stuck", auto_renew=False)
    lock.acquire()
    confirm = client.get(RELEASE, {"name": "stuck", "kind": "lock"})
    assert confirm.status_code == 200
    assert lock.owned()  # GET only asks
    body = confirm.content.decode()
    assert re.search(
        r"&middot; pid \d+ &middot; MainThread &middot; held for \d+\.\ds &middot; fencing token",
        body,
    )
    assert 'method="post"' in body
    assert "csrfmiddlewaretoken" in body
    # a POST without the CSRF token is refused
    assert client.post(RELEASE, {"name": "stuck", "kind": "lock"}).status_code == 403
    assert lock.owned()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    assert token is not None
    response = client.post(
        RELEASE, {"name": "stuck", "kind": "lock", "csrfmiddlewaretoken": token.group(1)}
    )
    assert response.status_code == 302
    assert response["Location"] == DASHBOARD
    assert not redis_client.exists("redislock:{stuck}:lock")
    with pytest.raises(LockLostError):
        lock.release()
    entry = LogEntry.objects.get()
    assert entry.user == user
    assert entry.action_flag == DELETION
    assert entry.object_repr == "stuck"
    assert entry.content_type.model == "heldlock"
    assert "Force-released lock" in entry.get_change_message()


@pytest.mark.parametrize("method", ["get", "post"])
def test_release_forbidden_without_permission(method: str) -> None:
    lock = Lock("keep", auto_renew=False)
    lock.acquire()
    response = getattr(client_for(staff()), method)(RELEASE, {"name": "keep", "kind": "lock"})
    assert response.status_code == 403
    assert lock.owned()
    assert not LogEntry.objects.exists()
    lock.release()


def test_release_of_a_free_or_bad_name_changes_nothing(admin_client: Client) -> None:
    response = admin_client.post(RELEASE, {"name": "ghost", "kind": "lock"}, follow=True)
    assert "is not held any more" in response.content.decode()
    response = admin_client.post(RELEASE, {"name": "x", "kind": "mutex"}, follow=True)
    assert "Unknown kind(s) mutex" in response.content.decode()
    response = admin_client.post(RELEASE, {"name": "", "kind": "lock"}, follow=True)
    assert "Bad name" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_redis_unreachable_is_reported(admin_client: Client) -> None:
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    caches = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=caches):
        body = admin_client.get(DASHBOARD).content.decode()
        data = admin_client.get(DATA)
    assert "Redis is unreachable or failed" in body
    assert data.status_code == 503
    assert data.json()["error"].startswith("Redis is unreachable")


def test_assets_are_served_by_the_app(admin_client: Client) -> None:
    for asset in ("django_redislock/dashboard.js", "django_redislock/dashboard.css"):
        assert finders.find(asset)
    body = admin_client.get(DASHBOARD).content.decode()
    external = re.findall(r'(?:src|href)="(https?:)?//', body)
    assert external == []


def test_counters_off_hides_the_column(admin_client: Client) -> None:
    with override_settings(REDISLOCK={"STATS": False}), Lock("quiet"):
        body = admin_client.get(DASHBOARD).content.decode()
        data: dict[str, Any] = admin_client.get(DATA).json()
    assert 'class="counters"' not in body
    assert data["results"][0]["counters"] == {}


def test_other_kinds_show_holders_limit_and_mode(
    admin_client: Client, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redislock.ops import inspection
    from tests.ops.test_locks_command import FakeSemaphoreKind

    fake = FakeSemaphoreKind()
    others = [k for k in inspection.KINDS if k.kind != fake.kind]  # the fake stands in
    monkeypatch.setattr("django_redislock.ops.inspection.KINDS", [*others, fake])
    redis_client.set("redislock:{pool}:fakesem", "x")
    body = admin_client.get(DASHBOARD).content.decode()
    row = admin_client.get(DATA).json()["results"][0]
    assert '<td class="kind">semaphore <span class="quiet">2/5</span></td>' in body
    assert '<span class="who">web-1 · pid 1 · T</span>' in body
    assert '<span class="who">web-2 · pid 2 · T (read)</span>' in body
    assert (row["kind"], row["limit"], row["waiters"]) == ("semaphore", 5, 4)
    response = admin_client.post(RELEASE, {"name": "pool", "kind": "semaphore"})
    assert response.status_code == 302
    assert fake.cleared == ["pool"]
    assert LogEntry.objects.get().object_repr == "pool"


def test_invalid_settings_are_reported_not_a_500(admin_client: Client) -> None:
    with override_settings(REDISLOCK={"TIMEOUT": -1}):
        body = admin_client.get(DASHBOARD).content.decode()
        data = admin_client.get(DATA)
    assert "django_redislock.E006" in body
    assert data.status_code == 503
    assert "E006" in data.json()["error"]


def test_rows_show_held_for_holder_context_and_waiters(
    admin_client: Client, redis_client: redis.Redis
) -> None:
    import threading
    import time

    from django_redislock.context import describe_holder

    holder = Lock("sku:5", timeout=60, auto_renew=False)
    with describe_holder("POST /shop/buy/5/"):
        holder.acquire()
    got: list[bool] = []

    def wait() -> None:
        with describe_holder("task shop.tasks.restock"):
            waiter = Lock("sku:5", timeout=60, blocking_timeout=30, auto_renew=False)
            got.append(waiter.acquire())
        waiter.release()

    thread = threading.Thread(target=wait, name="restocker")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not redis_client.zcard("redislock:{sku:5}:queue"):
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        row = admin_client.get(DATA).json()["results"][0]
        body = admin_client.get(DASHBOARD).content.decode()
    finally:
        holder.release()
        thread.join(30)
    assert got == [True]
    (data,) = row["holders"]
    assert data["runs"] == "POST /shop/buy/5/"
    assert data["thread"] == "MainThread"
    assert data["pid"].isdigit()
    assert 0 <= row["held_for"] < 30
    assert row["waiters"] == 1
    (queued,) = row["queue"]
    assert (queued["position"], queued["runs"], queued["thread"]) == (
        1,
        "task shop.tasks.restock",
        "restocker",
    )
    assert 0 <= queued["waited"] < 30
    assert '<th scope="col">Held for</th>' in body
    assert '<span class="runs">POST /shop/buy/5/</span>' in body
    assert re.search(
        r'<li value="1" title="[^"]+ · pid \d+ · restocker">'
        r'<span class="runs">task shop.tasks.restock</span> <span class="who">restocker · ',
        body,
    )


def test_redis_down_shows_the_error_and_nothing_else(admin_client: Client) -> None:
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    caches = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=caches):
        body = admin_client.get(DASHBOARD).content.decode()
        hot = admin_client.get(DASHBOARD + "hot/").content.decode()
    assert "Redis is unreachable or failed" in body
    for absent in ("Nothing is held", "redislock-table", "Hot names", "held</p>"):
        assert absent not in body
    assert "Redis is unreachable or failed" in hot


@pytest.mark.parametrize(("version", "markup"), [((6, 0), '<div class="breadcrumbs">'),
                                                 ((6, 1), '<ol class="breadcrumbs">')])  # fmt: skip
def test_breadcrumbs_match_the_admin_of_each_django(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, version: tuple[int, int], markup: str
) -> None:
    import django

    monkeypatch.setattr(django, "VERSION", (*version, 0, "final", 0))
    with Lock("crumbs", auto_renew=False) as lock:
        bodies = [
            admin_client.get(DASHBOARD).content.decode(),
            admin_client.get(RELEASE, {"name": "crumbs", "kind": "lock"}).content.decode(),
        ]
        assert lock.owned()
    for body in bodies:
        assert markup in body


def test_admin_force_release_is_logged(
    admin_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    lock = Lock("stuck:9", auto_renew=False)
    lock.acquire()
    with caplog.at_level("INFO", logger="django_redislock"):
        response = admin_client.post(
            RELEASE, {"name": "stuck:9", "kind": "lock"}, REMOTE_ADDR="10.1.2.3"
        )
    assert response.status_code == 302
    (record,) = [r for r in caplog.records if r.name == "django_redislock.audit"]
    assert record.levelname == "INFO"
    assert record.getMessage().startswith("Force-released lock 'stuck:9' held by ")
    assert record.getMessage().endswith("; released by admin from admin, 10.1.2.3.")
    assert LogEntry.objects.get().object_repr == "stuck:9"  # the LogEntry stays
    with pytest.raises(LockLostError):
        lock.release()


def test_hot_names_panel_ranks_and_charts(admin_client: Client, other_thread: OtherThread) -> None:

    recorder = tally.TALLY
    recorder.flush()
    for _ in range(3):
        with Lock("hot:a"):
            assert not other_thread(Lock("hot:a").acquire, blocking_timeout=0.05)
    with Lock("hot:b"):
        pass
    recorder.flush()
    body = admin_client.get(DASHBOARD, {"window": "5", "order": "timeouts"}).content.decode()
    fragment = admin_client.get(DASHBOARD + "hot/", {"order": "bogus"}).content.decode()
    assert 'id="redislock-hot"' in body
    assert '<option value="5" selected>' in body
    assert '<option value="timeouts" selected>' in body
    assert re.search(
        r'<tr data-name="hot:a">\s*<td class="name">hot:a</td>\s*'
        r'<td class="num">3</td>\s*<td class="num">3</td>\s*<td class="num">3</td>',
        body,
    ), body[body.find("redislock-hot-table") :][:800]
    assert 'data-name="hot:b"' not in body  # never contended
    assert body.count('<svg class="redislock-chart"') == 2
    assert '<rect class="bar"' in body
    assert 'data-name="hot:a"' in fragment  # an unknown order falls back to waits
    assert admin_client.post(DASHBOARD + "hot/").status_code == 405


@pytest.mark.slow
def test_page_and_search_over_100k_held_names(
    admin_client: Client, redis_client: redis.Redis, real_redis: None
) -> None:
    import time

    count = 100_000
    lockfill.fill(redis_client, count)
    redis_client.config_resetstat()
    started = time.monotonic()
    page = admin_client.get(DATA, {"page": 7}).json()
    found = admin_client.get(DATA, {"q": "bulk:04242"}).json()
    body = admin_client.get(DASHBOARD, {"q": "bulk:0999"}).content.decode()
    took = time.monotonic() - started
    assert (page["count"], page["pages"], len(page["results"])) == (count, 1000, 100)
    assert page["results"][0]["name"] == "bulk:000600"
    assert [r["name"] for r in found["results"]] == [f"bulk:04242{i}" for i in range(10)]
    assert "100 held" in body
    print(f"three dashboard requests over 100k names: {took:.2f}s")
    assert took < 60, f"three dashboard requests over 100k names took {took:.1f}s"
    stats = redis_client.info("commandstats")
    assert "cmdstat_keys" not in stats
    from django_redislock.ops import inspection

    # three requests, each one SCAN ... COUNT 1000 pass per kind, then O(page) reads
    assert stats["cmdstat_scan"]["calls"] <= 3 * len(inspection.KINDS) * (count // 1000 + 5)
    per_name = {"cmdstat_get", "cmdstat_pttl", "cmdstat_hgetall", "cmdstat_zcard"}
    # GET + PTTL (inside the scripts) and the counters' HGETALL of the 210 names
    # shown, and one HGETALL per minute of the hot-names panel's hour
    assert sum(s["calls"] for c, s in stats.items() if c in per_name) <= 3 * 210 + 60
    for command in ("cmdstat_evalsha", "cmdstat_scan"):
        assert stats[command]["usec_per_call"] < 2000, stats[command]


@pytest.mark.scaleout
def test_dashboard_on_a_redis_cluster(
    admin_client: Client, cluster_settings: Any, other_thread: OtherThread
) -> None:

    from django_redislock import Semaphore

    recorder = tally.TALLY
    with Lock("sku:1") as lock, Semaphore("pool", 2):
        assert not other_thread(Lock("sku:1").acquire, blocking_timeout=0.05)
        recorder.flush()  # the per-minute history, on the cluster too
        fence = lock.fencing_token
        rows = admin_client.get(DATA).json()["results"]
        body = admin_client.get(DASHBOARD, {"order": "timeouts"}).content.decode()
    assert [(r["name"], r["kind"]) for r in rows] == [("pool", "semaphore"), ("sku:1", "lock")]
    assert rows[1]["fencing_token"] == fence
    assert all(0 <= r["held_for"] < 30 for r in rows)
    assert '<tr data-name="sku:1">' in body  # a hot name


def test_semaphore_waiters_show_their_context_too(
    admin_client: Client, redis_client: redis.Redis
) -> None:
    import threading
    import time

    from django_redislock import Semaphore
    from django_redislock.context import describe_holder

    holder = Semaphore("pool:1", 1, timeout=60, auto_renew=False)
    holder.acquire()
    got: list[bool] = []

    def wait() -> None:
        with describe_holder("report nightly"):
            waiter = Semaphore("pool:1", 1, blocking_timeout=30, auto_renew=False)
            got.append(waiter.acquire())
        waiter.release()

    thread = threading.Thread(target=wait, name="reporter")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not redis_client.zcard("redislock:{pool:1}:sem:queue"):
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        row = admin_client.get(DATA).json()["results"][0]
    finally:
        holder.release()
        thread.join(30)
    assert got == [True]
    (queued,) = row["queue"]
    assert (queued["position"], queued["runs"], queued["thread"]) == (
        1,
        "report nightly",
        "reporter",
    )


def test_a_release_confirmed_for_one_holder_never_clears_the_next(admin_client: Client) -> None:
    """The form carries the confirmed holders' fencing tokens: if the name
    changed hands between the confirmation page and the POST, nothing is
    released and the page shows the new holder (found by a review: the new
    holder was cleared, and got LockLostError)."""
    first = Lock("handed", auto_renew=False)
    assert first.acquire()
    body = admin_client.get(RELEASE, {"name": "handed", "kind": "lock"}).content.decode()
    confirmed = re.search(r'name="holders" value="([^"]*)"', body)
    assert confirmed is not None and confirmed.group(1)
    holding = first._holding()
    assert holding is not None and holding.token not in body  # digests, not tokens
    first.release()
    second = Lock("handed", auto_renew=False)
    assert second.acquire()
    token = second.fencing_token  # taken on first use: shown from then on
    form = {"name": "handed", "kind": "lock", "holders": confirmed.group(1)}
    response = admin_client.post(RELEASE, form)
    assert response.status_code == 200  # the confirmation again, with the new holder
    assert "changed hands since you confirmed" in response.content.decode()
    assert str(token) in response.content.decode()
    assert second.owned()
    assert not LogEntry.objects.exists()
    again = re.search(r'name="holders" value="([^"]*)"', response.content.decode())
    assert again is not None and again.group(1) != confirmed.group(1)
    form["holders"] = again.group(1)  # confirmed again, for this holder
    assert admin_client.post(RELEASE, form).status_code == 302
    with pytest.raises(LockLostError):
        second.release()


# found by a review of the operator tooling ---------------------------------------------


def test_hot_names_are_kept_where_the_dashboard_reads_them(
    admin_client: Client, other_thread: OtherThread, redis_url: str, redis_client: redis.Redis
) -> None:
    """With a cache KEY_PREFIX (or VERSION) the history was written outside
    the cache's namespace, and the hot-names panel was always empty."""

    from tests.settings import redis_cache

    caches = {"default": {**redis_cache(redis_url), "KEY_PREFIX": "site1"}}
    with override_settings(CACHES=caches):
        recorder = tally.TALLY
        recorder.flush()
        for _ in range(2):
            with Lock("hot:pfx"):
                assert not other_thread(Lock("hot:pfx").acquire, blocking_timeout=0.05)
        recorder.flush()
        body = admin_client.get(DASHBOARD, {"order": "timeouts"}).content.decode()
    assert 'data-name="hot:pfx"' in body
    assert list(redis_client.scan_iter("redislock:site1:1:{~hot}:minute:*"))
    assert not list(redis_client.scan_iter("redislock:{~hot}:*"))


def test_a_release_made_is_logged_even_if_redis_fails_right_after(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's time was read after the clear: its failure reported an
    error for a release that was made, which the admin's log never recorded."""
    from django_redislock.ops import dashboard

    lock = Lock("stuck:x", auto_renew=False)
    lock.acquire()
    real = dashboard.server_time

    def unreachable(client: object) -> None:
        raise redis.ConnectionError("connection reset")

    monkeypatch.setattr("django_redislock.ops.dashboard.server_time", unreachable)
    response = admin_client.post(RELEASE, {"name": "stuck:x", "kind": "lock"}, follow=True)
    assert "unreachable" in response.content.decode()
    assert lock.owned()  # nothing was released, as the page says
    assert not LogEntry.objects.exists()
    monkeypatch.setattr("django_redislock.ops.dashboard.server_time", real)
    admin_client.post(RELEASE, {"name": "stuck:x", "kind": "lock"})
    assert LogEntry.objects.get().object_repr == "stuck:x"
    with pytest.raises(LockLostError):
        lock.release()


def test_odd_values_in_redis_are_shown_not_a_500(
    admin_client: Client, redis_client: redis.Redis
) -> None:
    """Values written by hand (or by another version): a lock value with a
    400-digit lease, a permit member with a non-ASCII digit, a counter and a
    history entry that are not numbers each made the page and ``data/`` a 500."""
    redis_client.set("redislock:{big}:lock", "ab12:0:1:5:" + "9" * 400 + ":0:host:1:T")
    redis_client.zadd("redislock:{sem}:semaphore", {"ab12:\u00b2:3:0:host:1:T": "+inf"})
    redis_client.hset("redislock:{sku:2}:stats", "acquired", "abc")
    minute = int(redis_client.time()[0] // 60)
    redis_client.hset(f"redislock:{{~hot}}:minute:{minute}", "x\x1facquired", "abc")
    admin_client.raise_request_exception = False
    with Lock("sku:2"):
        data = admin_client.get(DATA)
        assert data.status_code == 200
        assert admin_client.get(DASHBOARD).status_code == 200
    rows = {row["name"]: row for row in data.json()["results"]}
    assert {"big", "sem", "sku:2"} <= set(rows)
    assert rows["big"]["holders"][0]["holder"].startswith("unknown (a value this version")


def test_a_key_of_another_type_hides_no_other_lock(
    admin_client: Client, redis_client: redis.Redis
) -> None:
    redis_client.hset("redislock:{odd}:lock", "field", "value")
    with Lock("sku:1"):
        names = [row["name"] for row in admin_client.get(DATA).json()["results"]]
    assert names == ["odd", "sku:1"]
