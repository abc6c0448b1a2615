"""An edit lease in Redis: a ``Lock`` on the object that a page holds across requests.

The change form's request takes the lock and detaches it; the page keeps the
ticket (``Lock.detach``), and each later request (a renewal, the save, the
release on leaving) adopts it (``Lock.adopt``), does its work and detaches it
again, handing the page the next ticket. A ticket is good for one adoption:
a page whose lease was taken over, or ran out, holds a ticket nobody can
adopt any more, whatever it sends and however late.

Names: ``admin-edit:<app_label>.<model_name>:<pk>`` for the lease, and
``admin-edit-save:...`` for the short lock that a save and a take-over of
the same object each run under, so a take-over never clears a lease while
its holder's save is being written (``saving``). The holder's description
says who edits and since when (``describe``), so the dashboard and
``manage.py locks`` can show an edit lease as such (``parse``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from django_redislock import context
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import CLEAR_LOCK
from django_redislock.backend.values import parse_lock_value
from django_redislock.conf import get_settings
from django_redislock.exceptions import LockError, LockLostError
from django_redislock.primitives.lock import Lock

NAME_PREFIX = "admin-edit:"
SAVE_PREFIX = "admin-edit-save:"
#: How long a save waits for another save or take-over of the same object.
SAVE_WAIT = 10.0
_DESCRIPTION = re.compile(
    r"^admin edit lease, user (?P<user>[^ ,]+), since (?P<since>\d+): (?P<name>.*)$"
)
#: Take-over attempts when the holder renews (a new token) between its read and its clear.
_CLEAR_ATTEMPTS = 5


@dataclass(frozen=True)
class Editor:
    """Who holds an edit lease: the user (its pk as text, and its name as
    shown) and since when (seconds since the epoch, by the web node's clock
    that took it; kept through renewals)."""

    user_id: str
    username: str
    since: float


@dataclass(frozen=True)
class EditLeaseInfo:
    """An edit lease as the operator tools show it."""

    model: str  # "app_label.model_name"
    pk: str
    editor: Editor


@dataclass(frozen=True)
class Grant:
    """A lease just taken or renewed: the ticket the page keeps, and the hold's fencing token."""

    ticket: str
    fencing_token: int


def lease_name(model: str, pk: object) -> str:
    return f"{NAME_PREFIX}{model}:{pk}"


def editor_of(user: Any, since: float | None = None) -> Editor:
    return Editor(str(user.pk), str(user.get_username()), time.time() if since is None else since)


def describe(editor: Editor) -> str:
    """The holder description of ``editor``'s lease (the user's pk quoted, so
    it never holds a space or comma; the name last, where a cut does least harm)."""
    user = quote(editor.user_id, safe="")
    return f"admin edit lease, user {user}, since {int(editor.since)}: {editor.username}"


def parse_editor(holder: str) -> Editor | None:
    """The editor in a holder description (``host:pid:thread | what``), or ``None``."""
    found = _DESCRIPTION.match(context.split(holder)[1])
    if found is None:
        return None
    return Editor(unquote(found["user"]), found["name"], float(found["since"]))


def parse(name: str, holder: str) -> EditLeaseInfo | None:
    """An edit lease, if ``name`` and its holder's description are one."""
    if not name.startswith(NAME_PREFIX):
        return None
    model, sep, pk = name[len(NAME_PREFIX) :].partition(":")
    editor = parse_editor(holder)
    if not sep or editor is None:
        return None
    return EditLeaseInfo(model, pk, editor)


def _connect(using: str | None) -> tuple[Any, str]:
    settings = get_settings()
    alias = using or settings.cache
    return backend.get_client(alias), backend.namespace(alias, settings.key_prefix)


def holder(name: str, *, using: str | None = None) -> tuple[str, Editor | None] | None:
    """Who holds ``name`` now: its token and editor (``None`` for a holder
    that is not an edit lease), or ``None`` when it is free."""
    client, prefix = _connect(using)
    with backend.translate_errors(name):
        state = parse_lock_value(client.get(backend.key(prefix, name, "lock")))
    if state is None:
        return None
    return state.token, parse_editor(state.holder)


def take(name: str, editor: Editor, *, lease: float, using: str | None = None) -> Grant | None:
    """Take ``name`` for ``editor`` if it is free (no wait): the page's grant, or ``None``."""
    lock = Lock(name, timeout=lease, blocking=False, auto_renew=False, using=using, fencing=True)
    with context.describe_holder(describe(editor)):
        if not lock.acquire():
            return None
    fence = lock.fencing_token
    assert fence is not None
    return Grant(lock.detach(), fence)


@contextmanager
def adopted(ticket: str, editor: Editor) -> Iterator[Lock]:
    """The lease of ``ticket`` held by this thread for the block (``LockLostError``
    when it cannot be adopted: taken over, run out, or a ticket already used).
    The block releases it or detaches it again; a block that raises releases it."""
    if not isinstance(ticket, str) or not ticket:
        raise LockLostError("no edit lease ticket")
    with context.describe_holder(describe(editor)):
        lock = Lock.adopt(ticket)
        try:
            yield lock
        except BaseException:
            with suppress(LockError):
                lock.release()
            raise


def renew(ticket: str, editor: Editor, *, lease: float) -> Grant:
    """Extend the lease of ``ticket`` by ``lease`` seconds: the next ticket."""
    with adopted(ticket, editor) as lock:
        lock.extend(lease)
        fence = lock.fencing_token
        assert fence is not None
        return Grant(lock.detach(), fence)


def give_up(ticket: str, editor: Editor) -> bool:
    """Release the lease of ``ticket``; ``False`` when it was not held any more."""
    try:
        with adopted(ticket, editor) as lock:
            lock.release()
    except LockLostError:
        return False
    return True


def saving(name: str, *, using: str | None = None) -> Lock:
    """The lock a save and a take-over of the object behind ``name`` take (a
    ``with`` block; ``LockTimeout`` after ``SAVE_WAIT``)."""
    return Lock(SAVE_PREFIX + name[len(NAME_PREFIX) :], blocking_timeout=SAVE_WAIT, using=using)


def clear(name: str, user_id: str | None, *, using: str | None = None) -> bool:
    """Clear ``name``'s lease if ``user_id``'s (``None``: only if free): the
    take-over's first step, run under ``saving``. ``False`` when another
    editor holds it by now (the taker was not shown that one). The clear
    is confirmed by the holder's token, so a lease that changed hands
    after the read is left alone; a renewal between the two (which
    changes the token, not the editor) is read again."""
    client, prefix = _connect(using)
    keys = CLEAR_LOCK.keys_of(
        {part: backend.key(prefix, name, part) for part in CLEAR_LOCK.key_names}
    )
    for _ in range(_CLEAR_ATTEMPTS):
        found = holder(name, using=using)
        if found is None:
            return True
        token, editor = found
        if editor is None or editor.user_id != user_id:
            return False
        with backend.translate_errors(name):
            (result,) = CLEAR_LOCK(client, keys, CLEAR_LOCK.args_of(confirmed=token))
        if int(result) >= 0:
            return True
    return False
