"""What identifies one idempotent request: its key, scope and body fingerprint.

The ``Idempotency-Key`` header (IETF httpapi draft, an sf-string: ``"…"``; a
bare token is accepted too, as payment APIs send it) names the attempt; the
same key from another user, for another method or path is another attempt, so
one client's key can never replay another's response. The fingerprint is a
digest of the body: the same key with another body is the client's error
(422), not a replay.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http.request import RawPostDataException

HEADER = "Idempotency-Key"
#: Longest key accepted (payment APIs allow 255 characters).
MAX_KEY_LENGTH = 255
#: The names of the locks (and records) of idempotency keys: ``idempotency:<digest>``.
NAME_PREFIX = "idempotency:"

_QUOTED = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"\Z')
_BARE = re.compile(r"[!-~]+\Z")


class BadKey(ValueError):
    """An ``Idempotency-Key`` header that cannot be used (answered 400)."""


def parse_key(raw: str) -> str:
    """The key a header value carries; ``BadKey`` when it is malformed."""
    value = raw.strip()
    quoted = _QUOTED.match(value)
    if quoted:
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif _BARE.match(value) and '"' not in value:
        key = value
    else:
        raise BadKey(f"{HEADER} must be printable ASCII, as a quoted string, not {raw!r}.")
    if not key:
        raise BadKey(f"{HEADER} must not be empty.")
    if len(key) > MAX_KEY_LENGTH:
        raise BadKey(f"{HEADER} must be at most {MAX_KEY_LENGTH} characters, not {len(key)}.")
    return key


@dataclass(frozen=True)
class Attempt:
    """One request's claim on its idempotency key."""

    #: The lock's name, and the record's: ``idempotency:<digest of scope and key>``.
    name: str
    fingerprint: str
    key: str
    user: str
    method: str
    path: str


def user_scope(request: Any) -> str:
    """The authenticated user's primary key, or ``""`` (anonymous, or no auth)."""
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    return str(user.pk)


def fingerprint(request: Any) -> str:
    """A digest of the body (of the form fields and files, when a parser
    has already streamed a multipart body away, or when it is an upload over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``, which ``request.body`` refuses to read)."""
    django_request = getattr(request, "_request", request)
    digest = hashlib.sha256()
    try:
        digest.update(django_request.body)
    except (RawPostDataException, RequestDataTooBig):  # streamed: what was parsed from it
        for name, values in sorted(django_request.POST.lists()):
            digest.update(repr((name, values)).encode())
        for name, upload in sorted(django_request.FILES.items()):
            digest.update(repr((name, upload.name, upload.size)).encode())
    return digest.hexdigest()


def attempt_of(request: Any) -> Attempt | None:
    """The request's attempt, ``None`` without the header; ``BadKey`` when malformed."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    key = parse_key(raw)
    user = user_scope(request)
    method = str(request.method).upper()
    path = str(request.path)
    scope = "\0".join((user, method, path, key)).encode("utf-8", "surrogateescape")
    name = NAME_PREFIX + hashlib.sha256(scope).hexdigest()[:40]
    return Attempt(name, fingerprint(request), key, user, method, path)
