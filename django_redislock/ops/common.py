"""What ``manage.py locks`` and the admin dashboard share: connection, patterns, JSON.

Both are thin layers over ``inspection``; this module turns its results into
plain data (the stable JSON shape) and turns configuration and connection
failures into one ``OpsError`` whose message fits on one line.
"""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.editing import lease as edit_leases
from django_redislock.ops import inspection
from django_redislock.ops.inspection import HeldInfo
from django_redislock.validation import check_name


class OpsError(Exception):
    """A failure to report to an operator as one line (no traceback)."""


def connect(using: str | None = None) -> tuple[Any, str]:
    """The client and key prefix to inspect, or ``OpsError``."""
    try:
        settings = get_settings()
        alias = using or settings.cache
        return backend.get_client(alias), backend.namespace(alias, settings.key_prefix)
    except ImproperlyConfigured as exc:
        raise OpsError(str(exc)) from exc


def describe_error(exc: BaseException) -> str:
    message = " ".join(str(exc).split()) or type(exc).__name__
    return f"Redis is unreachable or failed: {type(exc).__name__}: {message}"


def check_name_arg(name: object) -> str:
    try:
        return check_name(name)
    except (TypeError, ValueError) as exc:
        raise OpsError(f"Bad name: {exc}") from exc


def check_pattern(pattern: object) -> str:
    """A glob over names (``fnmatch`` syntax: ``*``, ``?``, ``[seq]``, ``[!seq]``)."""
    try:
        pattern = check_name(pattern, "pattern")
    except (TypeError, ValueError) as exc:
        raise OpsError(f"Bad pattern: {exc}") from exc
    assert isinstance(pattern, str)
    if pattern.count("[") > pattern.count("]"):
        raise OpsError(f"Bad pattern {pattern!r}: '[' without a closing ']'.")
    fnmatch.translate(pattern)
    return pattern


def check_kinds(selected: Iterable[str] | None) -> list[str] | None:
    if selected is None:
        return None
    names = list(selected)
    try:
        inspection.kinds(names)
    except ValueError as exc:
        raise OpsError(str(exc)) from exc
    return names


def edit_lease_data(name: str, holder: str) -> dict[str, Any] | None:
    """An admin edit lease's object, user and since (``editing/lease.py``), or
    ``None`` for any other hold."""
    found = edit_leases.parse(name, holder)
    if found is None:
        return None
    editor = found.editor
    return {"model": found.model, "pk": found.pk, "user": editor.username,
            "user_id": editor.user_id, "since": editor.since}  # fmt: skip


def edit_lease_text(edit: dict[str, Any]) -> str:
    """An edit lease in one line, for people: ``ana editing shop.sku 1 since 10:42:00 UTC``."""
    since = datetime.datetime.fromtimestamp(edit["since"], tz=datetime.timezone.utc)
    return f"{edit['user']} editing {edit['model']} {edit['pk']} since {since:%H:%M:%S} UTC"


def holder_data(info: HeldInfo) -> list[dict[str, Any]]:
    """Each holder as plain data; an admin edit lease's holder also as
    ``edit_lease`` (object, user, since)."""
    return [
        {
            "holder": h.holder,
            "token": h.token[:8],
            "ttl": None if h.ttl is None else round(h.ttl, 3),
            "fencing_token": h.fencing_token,
            "count": h.count,
            "mode": h.mode,
            # the server's clock when the hold was detached, waiting for its adopter
            "detached_since": h.detached_since,
            "edit_lease": edit_lease_data(info.name, h.holder),
        }
        for h in info.holders
    ]


def info_data(info: HeldInfo, counters: dict[str, int] | None = None) -> dict[str, Any]:
    """The stable JSON shape of one held primitive (tokens shortened to 8 characters,
    enough to tell holders apart, too short to release someone else's hold)."""
    data: dict[str, Any] = {
        "name": info.name,
        "kind": info.kind,
        "holders": holder_data(info),
        "limit": info.limit,
        "waiters": info.waiters,
        "ttl": None if info.ttl is None else round(info.ttl, 3),
        "fencing_token": info.fencing_token,
    }
    if counters is not None:
        data["counters"] = counters
    return data


def glob_escape(text: str) -> str:
    """``text`` as a glob matching only itself (``fnmatch`` has no escape character)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


class Page:
    """One page of held primitives, for the dashboard.

    Only names are collected for every held primitive (SCAN, cheap); the
    full description and counters are fetched for the page shown, so a
    dashboard over thousands of locks stays fast.
    """

    def __init__(
        self,
        client: Any,
        prefix: str,
        *,
        query: str = "",
        number: int = 1,
        per_page: int = 100,
        counters: bool = True,
    ) -> None:
        pattern = f"*{glob_escape(query)}*" if query else None
        entries = sorted(
            {
                (name, kind.kind)
                for kind in inspection.kinds()
                for name in inspection.held_names(client, prefix, kind, pattern)
            }
        )
        self.count = len(entries)
        self.per_page = per_page
        self.pages = max(1, -(-self.count // per_page))
        self.number = min(max(1, number), self.pages)
        shown = entries[(self.number - 1) * per_page : self.number * per_page]
        by_kind: dict[str, list[str]] = {}
        for name, kind_name in shown:
            by_kind.setdefault(kind_name, []).append(name)
        infos = [
            info
            for kind in inspection.kinds(by_kind)
            for info in inspection.describe_many(kind, client, prefix, by_kind[kind.kind])
        ]
        infos.sort(key=lambda info: (info.name, info.kind))
        # names released between the SCAN and their description are not
        # counted either: "3 held" over two rows would be a lie
        self.count -= len(shown) - len(infos)
        self.infos = infos
        names = [info.name for info in infos]
        self.counters = inspection.stats(client, prefix, names) if counters else [{} for _ in names]

    def rows(self) -> list[dict[str, Any]]:
        return [
            info_data(info, counters)
            for info, counters in zip(self.infos, self.counters, strict=True)
        ]
