"""``django_redislock.testing``: what a project's own tests use."""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings

from django_redislock import Lock, Semaphore
from django_redislock.conf import get_settings
from django_redislock.testing import (
    assert_no_locks_held,
    fakeredis_caches,
    release_transaction_holds,
)
from tests.support.other_holders import OtherThread

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "testing-your-project.md"


def test_assert_no_locks_held_names_what_leaked() -> None:
    assert_no_locks_held()
    lock, sem = Lock("leak:1"), Semaphore("leak:pool", 2)
    lock.acquire()
    sem.acquire()
    with pytest.raises(AssertionError, match="2 still held") as info:
        assert_no_locks_held()
    assert "'leak:1'" in str(info.value) and "'leak:pool'" in str(info.value)
    lock.release()
    sem.release()
    assert_no_locks_held()


@pytest.mark.django_db
def test_release_transaction_holds_in_a_test_transaction(other_thread: OtherThread) -> None:
    from tests.models import Item

    item = Item.objects.create(stock=2)
    name = Item.inventory_lock_name(item.pk)
    item.deduct(1)
    assert other_thread(Lock(name).acquire, blocking=False) is False  # held to the "commit"
    assert release_transaction_holds() == 1
    assert not Lock(name).locked()
    assert transaction.get_connection().in_atomic_block  # the test's transaction goes on


def test_fakeredis_caches_serve_locks_across_threads(other_thread: OtherThread) -> None:
    pytest.importorskip("fakeredis")
    with override_settings(CACHES=fakeredis_caches()):
        with Lock("fake") as lock:
            assert lock.owned()
            assert other_thread(Lock("fake").acquire, blocking=False) is False
        assert not lock.locked()
        assert_no_locks_held()


@pytest.fixture
def _no_leaked_locks_as_documented() -> Any:
    """The fixture docs/testing-your-project.md gives, run from the page (its
    teardown runs before pytest-django's transaction ends)."""
    yield from _documented("def _no_leaked_locks")["_no_leaked_locks"].__wrapped__()


@pytest.mark.django_db
@pytest.mark.usefixtures("_no_leaked_locks_as_documented")
def test_the_documented_leak_fixture_passes_a_deduct_in_a_django_db_test() -> None:
    """Without its release_transaction_holds(), the documented fixture failed
    every django_db test that deducted (found by a review)."""
    from tests.models import Item

    item = Item.objects.create(stock=2)
    assert item.deduct(1) == 1
    assert Lock(Item.inventory_lock_name(item.pk)).locked()  # held until the transaction ends


def _documented(marker: str, page: Path = PAGE) -> dict[str, Any]:
    """Run the Python block of ``page`` that contains ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if marker in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(page), "exec"), namespace)
    return namespace


@pytest.mark.django_db
@pytest.mark.parametrize("page", [PAGE, DOCS / "api.md"], ids=lambda page: page.name)
def test_the_documented_test_buy_passes(page: Path) -> None:
    """The page's ``test_buy``, run against a ``@require_lock("sku:<pk>")`` view."""
    with override_settings(ROOT_URLCONF="tests.support.lock_views"):
        _documented("def test_buy", page)["test_buy"](Client())


def test_the_documented_xdist_fixture_keeps_the_rest_of_redislock(
    other_thread: OtherThread,
) -> None:
    """The fixture gives each worker its own prefix and keeps the project's other
    REDISLOCK keys: it replaced the whole dict, so a project's CACHE or
    TIMEOUT went back to the defaults under xdist."""
    worker = contextmanager(_documented("worker_id")["_lock_prefix_per_worker"].__wrapped__)
    with override_settings(REDISLOCK={"TIMEOUT": 5.0, "BLOCKING_TIMEOUT": 0}):
        with worker("gw0"):
            assert get_settings().key_prefix == "test-gw0"
            assert get_settings().timeout == 5.0 and get_settings().blocking_timeout == 0
            with Lock("order:1") as lock:
                assert lock.ttl() <= 5.0  # type: ignore[operator]
                with worker("gw1"):  # another worker, on the same Redis
                    theirs = Lock("order:1")
                    assert other_thread(theirs.acquire) is True  # not gw0's lock
                    other_thread(theirs.release)
