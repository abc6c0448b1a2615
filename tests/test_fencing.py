from __future__ import annotations

from typing import Any

import pytest
from django.db.models import F

from django_redislock import FenceField, Lock, fenced_update
from tests.support.procs import CTX, processes

pytestmark = pytest.mark.django_db


def test_newer_token_writes_older_and_equal_are_refused() -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create(value="a")
    assert fenced_update(record, 10, value="b")
    assert record.fence == 10
    assert not fenced_update(record, 9, value="stale")
    assert not fenced_update(record, 10, value="same token again")
    record.refresh_from_db()
    assert (record.value, record.fence) == ("b", 10)


def test_queryset_keeps_its_own_filter_and_takes_expressions() -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create(value="x", writes=1)
    guarded = FencedRecord.objects.filter(pk=record.pk, writes__gte=2)
    assert not fenced_update(guarded, 5, writes=F("writes") - 2)  # the guard refuses
    assert fenced_update(FencedRecord.objects.filter(pk=record.pk), 5, writes=F("writes") + 1)
    record.refresh_from_db()
    assert (record.writes, record.fence) == (2, 5)


def test_tokens_from_a_lock_fence_writes(redis_client: Any) -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create()
    with Lock("fenced") as lock:
        first = lock.fencing_token
        assert first is not None
    with Lock("fenced") as lock:
        second = lock.fencing_token
        assert second is not None
        assert fenced_update(record, second, value="second")
    assert not fenced_update(record, first, value="first, late")
    record.refresh_from_db()
    assert record.value == "second"


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"token": "7"}, TypeError, "token"),
        ({"token": True}, TypeError, "token"),
        ({"token": None}, TypeError, "token"),
        ({"token": 0}, ValueError, "token"),
        ({"token": -3}, ValueError, "token"),
        ({"token": 1, "field": ""}, TypeError, "field"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], argument: str) -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create()
    with pytest.raises(error, match=argument):
        fenced_update(record, **kwargs)


def test_bad_targets() -> None:
    from tests.models import FencedRecord

    with pytest.raises(ValueError, match="saved"):
        fenced_update(FencedRecord(), 1, value="x")
    with pytest.raises(TypeError, match="target"):
        fenced_update("not a row", 1)  # type: ignore[arg-type]


def test_fence_field_holds_microsecond_clock_tokens() -> None:
    from tests.models import FencedRecord

    big = 2**62
    record = FencedRecord.objects.create()
    assert fenced_update(record, big, value="big")
    record.refresh_from_db()
    assert record.fence == big
    _, path, _, kwargs = FenceField().deconstruct()
    assert path == "django_redislock.fencing.FenceField"
    assert kwargs == {}


def _write_with_token(pk: int, token: int, results: Any) -> None:
    from tests.models import FencedRecord

    results.put((token, fenced_update(FencedRecord.objects.filter(pk=pk), token, value=str(token))))


@pytest.mark.django_db(transaction=True)
def test_racing_processes_leave_the_highest_token() -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create()
    results = CTX.Queue()
    tokens = [5, 3, 9, 1, 7, 8]
    with processes(_write_with_token, [(record.pk, t, results) for t in tokens]):
        pass
    outcomes = dict(results.get(timeout=10) for _ in tokens)
    record.refresh_from_db()
    assert (record.fence, record.value) == (9, "9")
    assert outcomes[9] is True
    # every applied write was newer than every write applied before it, so the
    # number applied is at most the length of an increasing run of arrivals
    assert 1 <= sum(outcomes.values()) <= len(tokens)


def test_an_instance_is_written_in_the_database_it_came_from() -> None:
    """Not the default one (found by a review: a row read from another
    database was never written, or a default row with its pk was)."""
    from django.db.utils import ConnectionDoesNotExist

    from tests.models import FencedRecord

    record = FencedRecord.objects.create(value="a")
    assert record._state.db == "default"
    record._state.db = "elsewhere"  # as if read with .using("elsewhere")
    with pytest.raises(ConnectionDoesNotExist, match="elsewhere"):
        fenced_update(record, 5, value="b")
    record._state.db = "default"
    assert fenced_update(record, 5, value="b")


class _PrimaryWrites:
    """A primary/replica router: reads from a replica, writes to the primary."""

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"


def test_an_instance_read_from_a_replica_is_written_on_the_primary() -> None:
    """Where its ``save()`` writes (the routers), not where it was read from."""
    from django.test import override_settings

    from tests.models import FencedRecord

    record = FencedRecord.objects.create(value="a")
    record._state.db = "replica"  # as if read through the router's replica
    with override_settings(DATABASE_ROUTERS=[f"{__name__}._PrimaryWrites"]):
        assert fenced_update(record, 5, value="b")
    assert FencedRecord.objects.get(pk=record.pk).value == "b"


def test_an_instance_its_default_manager_hides_is_written_as_save_would() -> None:
    """Through the base manager, as ``save()`` writes: the default manager
    (a soft-delete or published-only filter) hid the row, so the write was
    refused as if a newer holder had written (found by a review)."""
    from tests.models import FencedRecord, PublishedRecord

    draft = PublishedRecord._base_manager.get(pk=FencedRecord.objects.create(value="").pk)
    assert not PublishedRecord._default_manager.filter(pk=draft.pk).exists()
    assert fenced_update(draft, 5, writes=1)
    assert (draft.fence, FencedRecord.objects.get(pk=draft.pk).writes) == (5, 1)
    assert not fenced_update(draft, 4, writes=2)  # the fence still refuses an older token


def _write_child_on_command(pk: int, token: int, commands: Any, results: Any) -> None:
    from tests.models import FencedChild

    child = FencedChild.objects.get(pk=pk)
    assert commands.get(timeout=60) == "write"
    results.put(fenced_update(child, token, value=f"written with {token}", note="stale"))


def _wait_for_a_blocked_statement() -> None:
    """Until some backend waits for a row lock (pg_locks is read live)."""
    import time

    from django.db import connection

    deadline = time.monotonic() + 30
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)  # a poll of the database's lock table, not a synchronisation
    raise AssertionError("the stale write never waited for the row")


@pytest.mark.django_db(transaction=True)
def test_a_stale_token_never_writes_a_multi_table_childs_row() -> None:
    """The fence of a multi-table child lives in its parent's table: Django
    updated it with a SELECT of the ids where ``fence < token`` and then an
    ``UPDATE`` by id, so a stale holder that selected before a newer one
    committed wrote after it, and the fence went back from 8 to 7 (found by
    a review). Now the fence's own table is written first, with the check in
    its ``UPDATE``, and the child's columns after it, in one transaction."""
    from django.db import connection, transaction

    from tests.models import FencedChild, FencedRecord

    if connection.vendor != "postgresql":
        pytest.skip("row locks of PostgreSQL; SQLite's file lock serialises the writers")
    child = FencedChild.objects.create(value="first")
    commands, results = CTX.Queue(), CTX.Queue()
    with processes(_write_child_on_command, [(child.pk, 7, commands, results)], timeout=60):
        with transaction.atomic():
            newer = FencedChild.objects.get(pk=child.pk)
            assert fenced_update(newer, 8, value="written with 8", note="newer")
            commands.put("write")  # the stale holder, while the newer write is uncommitted
            _wait_for_a_blocked_statement()
        assert results.get(timeout=30) is False
    row = FencedChild.objects.get(pk=child.pk)
    assert (row.fence, row.value, row.note) == (8, "written with 8", "newer")
    assert FencedRecord.objects.get(pk=child.pk).fence == 8


def test_a_multi_table_childs_fields_of_both_tables_are_written_and_fenced() -> None:
    from tests.models import FencedChild

    child = FencedChild.objects.create(value="a")
    assert fenced_update(child, 5, value="b", note="n")
    assert child.fence == 5
    assert not fenced_update(child, 4, value="stale", note="stale")
    row = FencedChild.objects.get(pk=child.pk)
    assert (row.fence, row.value, row.note) == (5, "b", "n")


def test_a_queryset_whose_update_would_leave_the_check_out_of_it_is_refused() -> None:
    """A join in its filter, or fields of a parent's table: Django writes it
    as a SELECT of ids (or a subquery) and an UPDATE by id, which a newer
    holder's write can pass between (found by a review)."""
    from tests.models import FencedChild, FencedRecord

    child = FencedChild.objects.create(value="a", note="n")
    for queryset, values in (
        (FencedChild.objects.filter(pk=child.pk), {"value": "b"}),
        (FencedChild.objects.filter(pk=child.pk), {"note": "b"}),  # the fence is a parent's
        (FencedRecord.objects.filter(pk=child.pk, fencedchild__note="n"), {"value": "b"}),
    ):
        with pytest.raises(ValueError, match="would not be in the UPDATE itself"):
            fenced_update(queryset, 5, **values)
    row = FencedChild.objects.get(pk=child.pk)
    assert (row.fence, row.value, row.note) == (0, "a", "n")
    assert fenced_update(FencedRecord.objects.filter(pk=child.pk), 5, value="b")


def test_expected_refuses_a_write_whose_read_went_stale() -> None:
    """``expected`` is checked in the same UPDATE as the fence: the fence as
    read refuses the write once anyone wrote since (a plain fence check lets
    a write from an older token land in between; see
    tests/faults/test_fenced_read_modify_write.py)."""
    from tests.models import FencedRecord

    record = FencedRecord.objects.create(writes=3, fence=6)
    read = FencedRecord.objects.get(pk=record.pk)
    assert fenced_update(record, 7, writes=4)  # an older holder writes after the read
    assert not fenced_update(read, 8, expected={"fence": read.fence}, writes=read.writes + 1)
    assert read.fence == 6  # not written: the instance keeps what was read
    again = FencedRecord.objects.get(pk=read.pk)
    assert fenced_update(again, 8, expected={"fence": again.fence}, writes=again.writes + 1)
    assert again.fence == 8
    queryset = FencedRecord.objects.filter(pk=record.pk)
    assert not fenced_update(queryset, 9, expected={"writes__lt": 5}, writes=F("writes") + 1)
    assert fenced_update(queryset, 9, expected={"writes": 5}, writes=F("writes") + 1)
    record.refresh_from_db()
    assert (record.writes, record.fence) == (6, 9)


def test_expected_on_a_multi_table_child_guards_the_fences_own_table() -> None:
    from tests.models import FencedChild

    child = FencedChild.objects.create(value="a", note="n")
    assert fenced_update(child, 5, expected={"fence": 0, "value": "a"}, note="m")
    with pytest.raises(ValueError, match="table that holds 'fence'"):
        fenced_update(child, 6, expected={"note": "m"}, value="b")
    with pytest.raises(ValueError, match="no field 'nope'"):
        fenced_update(child, 6, expected={"nope": 1}, value="b")
    assert FencedChild.objects.get(pk=child.pk).fence == 5


@pytest.mark.parametrize("expected", ["fence", [("fence", 1)], {1: 2}, {"": 0}])
def test_bad_expected(expected: Any) -> None:
    from tests.models import FencedRecord

    record = FencedRecord.objects.create()
    with pytest.raises(TypeError, match="expected"):
        fenced_update(record, 1, expected=expected, value="x")
