"""``django_redislock.testing``: what a project's own tests use."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_redislock import Lock, Semaphore
from django_redislock.testing import (
    assert_no_locks_held,
    fakeredis_caches,
    release_transaction_holds,
)
from tests.holders import OtherThread


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
    """The fixture docs/testing-your-project.md gives (its teardown runs before
    pytest-django's transaction ends)."""
    from django_redislock.testing import release_transaction_holds

    yield
    release_transaction_holds()  # what the test's rollback would release
    assert_no_locks_held()


@pytest.mark.django_db
@pytest.mark.usefixtures("_no_leaked_locks_as_documented")
def test_the_documented_leak_fixture_passes_a_deduct_in_a_django_db_test() -> None:
    """Without its release_transaction_holds(), the documented fixture failed
    every django_db test that deducted (found by a review)."""
    from tests.models import Item

    item = Item.objects.create(stock=2)
    assert item.deduct(1) == 1
    assert Lock(Item.inventory_lock_name(item.pk)).locked()  # held until the transaction ends
