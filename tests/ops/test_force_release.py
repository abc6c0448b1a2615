"""An operator's force-release (the admin's, ``locks clear`` answered "yes")
never clears a holder the operator was not shown, even when the name
changes hands in the moment between the last read and the clear.

Each test hands the name over right before the clear's round trip (by
wrapping the kind's clear), the window that a read-then-clear in two round
trips left open: the new holder was cleared, and got ``LockLostError``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import Client

from django_redislock import Lock, ReadWriteLock, Semaphore
from django_redislock.ops.kinds import LockKind, RWLockKind, SemaphoreKind
from tests.support.other_holders import OtherThread

RELEASE = "/admin/django_redislock/heldlock/release/"


def hand_over_before(
    monkeypatch: pytest.MonkeyPatch, kind: type, method: str, hand_over: Callable[[], None]
) -> None:
    """Run ``hand_over`` once, just before ``kind.method`` clears."""
    real = getattr(kind, method)
    pending = [hand_over]

    def clear(self: Any, *args: Any, **kwargs: Any) -> Any:
        while pending:
            pending.pop()()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kind, method, clear)


def confirmed_holders(admin_client: Client, name: str, kind: str) -> str:
    body = admin_client.get(RELEASE, {"name": name, "kind": kind}).content.decode()
    found = re.search(r'name="holders" value="([^"]*)"', body)
    assert found is not None and found.group(1)
    return found.group(1)


def handles(kind: str) -> tuple[Any, Any]:
    """The holder the operator is shown, and the one that takes the name after it."""
    if kind == "lock":
        return Lock("handed", auto_renew=False), Lock("handed", auto_renew=False)
    if kind == "semaphore":
        return (
            Semaphore("handed", 1, auto_renew=False),
            Semaphore("handed", 1, auto_renew=False),
        )
    return (
        ReadWriteLock("handed", auto_renew=False).read(),
        ReadWriteLock("handed", auto_renew=False).write(),
    )


CLEARS = {
    "lock": (LockKind, "clear_many"),
    "semaphore": (SemaphoreKind, "clear"),
    "rwlock": (RWLockKind, "clear"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["lock", "semaphore", "rwlock"])
def test_the_admin_never_clears_a_holder_that_took_the_name_during_the_release(
    admin_client: Client,
    other_thread: OtherThread,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    first, second = handles(kind)
    assert first.acquire()
    confirmed = confirmed_holders(admin_client, "handed", kind)

    def hand_over() -> None:
        first.release()
        assert other_thread(second.acquire)
        other_thread(lambda: second.fencing_token)  # a Lock's is taken on first use

    hand_over_before(monkeypatch, *CLEARS[kind], hand_over)
    form = {"name": "handed", "kind": kind, "holders": confirmed}
    response = admin_client.post(RELEASE, form)
    body = response.content.decode()
    assert response.status_code == 200  # the confirmation again, with the new holder
    assert "changed hands since you confirmed; nothing was released" in body
    assert other_thread(second.owned)
    assert not LogEntry.objects.exists()
    assert f"fencing token {other_thread(lambda: second.fencing_token)}" in body
    again = re.search(r'name="holders" value="([^"]*)"', body)
    assert again is not None and again.group(1) not in ("", confirmed)
    other_thread(second.release)


@pytest.mark.django_db
def test_the_admin_says_so_when_nobody_holds_the_name_by_the_clear(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = Lock("freed", auto_renew=False)
    assert lock.acquire()
    confirmed = confirmed_holders(admin_client, "freed", "lock")
    hand_over_before(monkeypatch, LockKind, "clear_many", lock.release)
    form = {"name": "freed", "kind": "lock", "holders": confirmed}
    response = admin_client.post(RELEASE, form, follow=True)
    assert "is not held any more" in response.content.decode()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_locks_clear_never_clears_a_holder_that_took_the_name_after_the_answer(
    other_thread: OtherThread, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    first, second = handles(kind)
    kept = Lock("unchanged", auto_renew=False)
    assert first.acquire() and kept.acquire()

    def hand_over() -> None:
        first.release()
        assert other_thread(second.acquire)
        other_thread(lambda: second.fencing_token)  # a Lock's is taken on first use

    hand_over_before(monkeypatch, *CLEARS[kind], hand_over)
    out, err = io.StringIO(), io.StringIO()
    with mock.patch("builtins.input", return_value="yes"):
        call_command("locks", "clear", "handed", "unchanged", stdout=out, stderr=err)
    assert "Not cleared, changed hands since listed: handed" in err.getvalue()
    assert f"Released {kind} handed" not in out.getvalue()
    assert "Released lock unchanged" in out.getvalue()
    assert other_thread(second.owned)
    assert not kept.owned()
    other_thread(second.release)


def test_locks_clear_noinput_still_clears_whoever_holds_the_name(
    other_thread: OtherThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = handles("lock")
    assert first.acquire()

    def hand_over() -> None:
        first.release()
        assert other_thread(second.acquire)
        other_thread(lambda: second.fencing_token)  # a Lock's is taken on first use

    hand_over_before(monkeypatch, LockKind, "clear_many", hand_over)
    out = io.StringIO()
    call_command("locks", "clear", "handed", "--noinput", stdout=out, stderr=io.StringIO())
    assert "Released lock handed" in out.getvalue()
    assert not other_thread(second.owned)
