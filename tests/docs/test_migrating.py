"""Docs as tests: every Python block of ``docs/migrating.md``, before and after.

The blocks marked ``<!-- test: NAME -->`` are taken from the page as they are
(never copied here) and run against the suite's own redis-server: each
"before" block with the old library it shows (django-redis's ``cache.lock()``,
``redis.asyncio``, python-redis-lock, celery-once, ``select_for_update``) and
each "after" block with this one. Each pair meets the same two situations, the
name free and the name held by another holder (a thread of its own), and must
give the same outcome in both (the busy answer's form aside, which the page
says changes). Every Python block of the page must be marked, so none can go
stale unrun.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import types
import warnings
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import RequestFactory, override_settings

from django_redislock import ALREADY_RUNNING, Lock
from django_redislock.testing import assert_no_locks_held
from tests.support.other_holders import OtherThread

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "migrating.md"
MARKED = re.compile(r"<!-- test: (?P<what>[^ ]+) -->\n```python\n(?P<code>.*?)```", re.S)
#: The address the page's blocks write; the tests give them the suite's server.
PAGE_URL = "redis://127.0.0.1:6379/0"
SIDES = ["before", "after"]


def blocks() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    found = [(m["what"], m["code"]) for m in MARKED.finditer(text)]
    names = [what for what, _ in found]
    assert len(names) == len(set(names)), f"a marker is used twice: {names}"
    assert len(found) == text.count("```python\n"), "a Python block of the page is not marked"
    return dict(found)


def load(what: str, *, module: str | None = None, url: str | None = None) -> types.ModuleType:
    """The page's block ``what``, run as the module ``module`` (a project's
    ``views.py``, ``tasks.py`` or command), with the suite's Redis for the
    page's address and the suite's ``Account`` for the shop's."""
    code = blocks()[what]
    if url is not None:
        assert PAGE_URL in code, f"{what}: the page no longer writes {PAGE_URL}"
        code = code.replace(PAGE_URL, url)
    code = code.replace("from shop.models import Account", "from tests.models import Account")
    namespace = types.ModuleType(module or f"migrating_{what.replace('-', '_')}")
    exec(compile(code, str(PAGE), "exec"), namespace.__dict__)
    return namespace


@pytest.fixture
def rf() -> RequestFactory:
    return RequestFactory()


def test_every_block_of_the_page_is_marked_and_run_here() -> None:
    assert set(blocks()) == {
        f"{lock}-{side}"
        for lock in ("cache-lock", "redis-py", "python-redis-lock", "celery-once", "db-lock")
        for side in SIDES
    } | {"celery-once-config", "side-by-side", "bridge", "django-valkey"}


@pytest.mark.parametrize("side", SIDES)
def test_a_view_under_cache_lock_and_under_require_lock(
    side: str, rf: RequestFactory, other_thread: OtherThread
) -> None:
    buy = load(f"cache-lock-{side}").buy
    assert buy(rf.get("/buy/1/"), pk=1).content == b"bought\n"
    holder = cache.lock("sku:1", timeout=30) if side == "before" else Lock("sku:1")
    assert other_thread(holder.acquire)  # another request is buying SKU 1
    try:
        busy = buy(rf.get("/buy/1/"), pk=1)
        assert buy(rf.get("/buy/2/"), pk=2).content == b"bought\n"  # another SKU is free
    finally:
        other_thread(holder.release)
    if side == "before":
        assert (busy.status_code, busy.content) == (409, b"busy\n")
    else:
        assert busy.status_code == 423
        assert 1 <= int(busy["Retry-After"]) <= 30
    assert buy(rf.get("/buy/1/"), pk=1).content == b"bought\n"


@pytest.mark.parametrize("side", SIDES)
def test_an_async_view_under_redis_asyncio_and_under_async_lock(
    side: str, rf: RequestFactory, other_thread: OtherThread, redis_url: str
) -> None:
    import redis

    views = load(f"redis-py-{side}", url=redis_url if side == "before" else None)
    raw = redis.Redis.from_url(redis_url)
    holder = raw.lock("prices:acme", timeout=30) if side == "before" else Lock("prices:acme")

    async def scenario() -> list[tuple[int, bytes]]:
        answers = []
        try:
            answers.append(await views.refresh_prices(rf.post("/"), shop="acme"))
            assert other_thread(holder.acquire)  # another worker is refreshing acme
            try:
                answers.append(await views.refresh_prices(rf.post("/"), shop="acme"))
                answers.append(await views.refresh_prices(rf.post("/"), shop="globex"))
            finally:
                other_thread(holder.release)
            answers.append(await views.refresh_prices(rf.post("/"), shop="acme"))
        finally:
            if side == "before":
                client = views.client
                await (client.aclose() if hasattr(client, "aclose") else client.close())
        return [(answer.status_code, answer.content) for answer in answers]

    try:
        assert asyncio.run(scenario()) == [
            (200, b"refreshed\n"),
            (409, b"already refreshing\n"),
            (200, b"refreshed\n"),
            (200, b"refreshed\n"),
        ]
    finally:
        raw.close()


@pytest.mark.parametrize("side", SIDES)
def test_a_cron_command_under_python_redis_lock_and_under_single_run(
    side: str, other_thread: OtherThread
) -> None:
    if side == "before":
        pytest.importorskip("redis_lock")  # python-redis-lock: the bench extra
    command = load(
        f"python-redis-lock-{side}", module="shop.management.commands.send_reminders"
    ).Command

    def run() -> tuple[str, str]:
        out, err = StringIO(), StringIO()
        call_command(command(), stdout=out, stderr=err)
        return out.getvalue(), err.getvalue()

    assert run() == ("reminders sent\n", "")
    if side == "before":
        import redis_lock
        from django_redis import get_redis_connection

        holder: Any = redis_lock.Lock(get_redis_connection("default"), "send-reminders", expire=60)
    else:
        holder = Lock("send-reminders")
    assert other_thread(holder.acquire)  # a run still going, on another host
    try:
        if side == "before":
            assert run() == ("", "send_reminders is already running\n")  # and exit status 0
        else:
            with pytest.raises(CommandError, match="send_reminders is already running") as e:
                run()
            assert e.value.returncode == ALREADY_RUNNING
    finally:
        other_thread(holder.release)
    assert run() == ("reminders sent\n", "")


@pytest.fixture
def celery_app(redis_url: str) -> Iterator[Any]:
    """The page's Celery app, running tasks where they are sent (eagerly),
    celery-once's ``apply_async`` included."""
    pytest.importorskip("celery")
    from celery import _state

    previous = _state.get_current_app()
    app = load("celery-once-config", url=redis_url).app
    app.conf.update(task_always_eager=True, task_eager_propagates=True)
    app.set_current()
    try:
        yield app
    finally:
        previous.set_current()


def import_celery_once() -> None:
    """celery-once 3.0.1's docstrings hold an invalid escape (``"\\*"``): a
    ``SyntaxWarning`` (a ``DeprecationWarning`` before Python 3.12), which the
    suite's warnings-as-errors would turn into a ``SyntaxError`` wherever its
    source is compiled without a bytecode cache. Not ours to fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("celery_once")  # the test extra


def test_a_task_under_celery_once(celery_app: Any) -> None:
    import_celery_once()
    task = load("celery-once-before", module="before.tasks").nightly_report
    assert task.delay("monday").get() == "report for monday"
    # What .delay leaves on a real broker until the worker has run it: the lock.
    key = task.get_key(args=("monday",))
    task.once_backend.raise_or_lock(key, timeout=60)
    try:
        skipped = task.delay("monday", fmt="csv")  # keys=["day"]: fmt does not count
        assert (skipped.state, skipped.result) == ("REJECTED", None)  # graceful
        assert task.delay("tuesday").get() == "report for tuesday"
    finally:
        task.once_backend.clear_lock(key)
    assert task.delay("monday").get() == "report for monday"


def test_a_task_under_require_lock(celery_app: Any, other_thread: OtherThread) -> None:
    task = load("celery-once-after", module="after.tasks").nightly_report
    assert task.delay("monday").get() == "report for monday"
    holder = Lock("report:monday")
    assert other_thread(holder.acquire)  # a run in progress on another worker
    try:
        assert task.delay("monday", fmt="csv").get() == "skipped"  # named from day only
        assert task.delay("tuesday").get() == "report for tuesday"
        assert task("monday") == "skipped"  # a direct call is locked too
    finally:
        other_thread(holder.release)
    assert task.delay("monday").get() == "report for monday"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("side", SIDES)
def test_a_row_lock_and_require_lock_lose_no_update(
    side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads add 10 points each through the view, each save a few
    milliseconds after its read (so that, without a lock, updates are lost on
    PostgreSQL and SQLite refuses a second writer). SQLite ignores
    ``select_for_update()``, so there the "before" block runs in one thread;
    the "after" block runs in four on every database, the lock held until
    each commit."""
    from tests.models import Account

    save = Account.save

    def slow_save(self: Account, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.005)  # widens the read-modify-write window; no synchronisation
        save(self, *args, **kwargs)

    monkeypatch.setattr(Account, "save", slow_save)
    add_points = load(f"db-lock-{side}").add_points
    account = Account.objects.create()
    workers = 4 if side == "after" or connection.vendor == "postgresql" else 1
    failures: list[BaseException] = []

    def add() -> None:
        factory = RequestFactory()
        try:
            for _ in range(10):
                answer = add_points(factory.post("/", {"points": "1"}), pk=account.pk)
                assert answer.status_code == 200, answer
        except BaseException as exc:  # reported by the test below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=add) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    account.refresh_from_db()
    assert account.points == 10 * workers
    assert_no_locks_held()  # released at each commit


def test_old_and_new_locks_on_one_name_do_not_exclude_each_other() -> None:
    load("side-by-side")  # its own asserts: both held at once
    assert not cache.lock("report:monday").locked()
    assert_no_locks_held()


def test_the_bridge_excludes_old_and_new_code(other_thread: OtherThread) -> None:
    rebuild_report = load("bridge").rebuild_report
    assert rebuild_report("monday") == "report for monday"
    for holder in (cache.lock("report:monday", timeout=30), Lock("report:monday")):
        assert other_thread(holder.acquire)  # old code, then new code, holds it
        try:
            assert rebuild_report("monday") == "skipped"
            assert rebuild_report("tuesday") == "report for tuesday"
        finally:
            other_thread(holder.release)
    assert rebuild_report("monday") == "report for monday"
    assert not cache.lock("report:monday").locked()
    assert_no_locks_held()


def test_a_rolling_switch_to_django_valkey_keeps_every_lock(
    redis_url: str, other_thread: OtherThread
) -> None:
    """The page's django-valkey cache beside the django-redis cache it replaces,
    on one server: one lock, whichever side holds it."""
    new = load("django-valkey", url=redis_url).CACHES["default"]
    assert new["BACKEND"] == "django_valkey.cache.ValkeyCache"
    old = {**new, "BACKEND": "django_redis.cache.RedisCache"}
    with override_settings(CACHES={"default": new, "old": old}):
        for holding, other in (("old", "default"), ("default", "old")):
            holder = Lock("sku:42", using=holding)
            assert other_thread(holder.acquire)
            assert Lock("sku:42", using=other).locked()
            assert not Lock("sku:42", using=other).acquire(blocking=False)
            other_thread(holder.release)
            with Lock("sku:42", using=other):
                pass
        assert_no_locks_held()


def test_the_page_is_linked_from_the_readme_the_quickstart_and_the_nav() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "/docs/migrating.md)" in readme
    assert "(migrating.md)" in (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    assert "(migrating.md)" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "migrating.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
