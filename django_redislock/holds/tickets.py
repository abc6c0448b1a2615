"""A detached hold's ticket: what another process needs to adopt it.

``Lock.detach()`` hands a hold off as a ticket, a string a task broker can
carry (ASCII, JSON inside, no pickle), and ``Lock.adopt(ticket)`` takes it
over. The ticket is signed with ``django.core.signing`` (an HMAC keyed by
``SECRET_KEY``; ``SECRET_KEY_FALLBACKS`` verify it too), so a ticket that
was forged or edited is refused before Redis is asked; and it carries the
detached hold's token, which Redis checks and swaps for the adopter's
(``lock_adopt.lua``), so a genuine ticket works once, and only while the
hold's lease lasts. The signature is what makes the fields that Redis does
not check (the lease, the cache alias, the key prefix) trustworthy.

The token is a bearer secret: whoever holds the ticket can adopt the hold
(and so release it) until it is adopted. Pass it where you would pass a
session id, not into logs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.core import signing

from django_redislock.exceptions import LockLostError

#: Tells the tickets apart from every other use of ``signing`` with SECRET_KEY.
SALT = "django_redislock.ticket"
#: The ticket format's version: a ticket of another version is refused.
VERSION = 1

#: What every refused ticket's message says happened.
NOT_ADOPTED = "nothing was adopted"


@dataclass(frozen=True)
class Ticket:
    """What a ticket carries, as signed."""

    kind: str  # the primitive's kind ("lock")
    name: str
    using: str  # the cache alias the hold is on (resolved: never None)
    prefix: str  # the key prefix its keys are under (``backend.namespace``)
    token: str  # the detached hold's token, swapped by its adopter
    fence: int  # its fencing token when detached (0: not taken yet)
    lease_ms: int  # its lease, set at the detach and kept by the adopter
    detached_ms: int  # the server's clock at the detach

    def dumps(self) -> str:
        """The ticket as a signed, URL-safe ASCII string."""
        return signing.dumps({"v": VERSION, **asdict(self)}, salt=SALT, compress=False)


def loads(ticket: object) -> Ticket:
    """The ``Ticket`` in ``ticket``; ``LockLostError`` when it was forged or
    edited (or signed with another ``SECRET_KEY``), ``TypeError`` when it is
    no string at all."""
    if not isinstance(ticket, str):
        raise TypeError(f"ticket must be a str from detach(), not {type(ticket).__name__}")
    try:
        data: Any = signing.loads(ticket, salt=SALT)
    except signing.BadSignature as exc:
        raise LockLostError(
            "The lock ticket was forged or edited (its signature does not match this "
            f"site's SECRET_KEY): {NOT_ADOPTED}."
        ) from exc
    try:
        if data.pop("v") != VERSION:
            raise ValueError("version")
        found = Ticket(**data)
        checks = (
            (found.kind, str), (found.name, str), (found.using, str), (found.prefix, str),
            (found.token, str), (found.fence, int), (found.lease_ms, int),
            (found.detached_ms, int),
        )  # fmt: skip
        if not all(type(value) is kind for value, kind in checks) or found.lease_ms <= 0:
            raise ValueError("fields")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # signed, yet not ours
        raise LockLostError(
            f"The lock ticket is not one this version of django-redislock reads: {NOT_ADOPTED}."
        ) from exc
    return found
