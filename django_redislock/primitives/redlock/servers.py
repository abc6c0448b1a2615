"""Which servers a ``Redlock`` uses, and the lock-script calls it makes there.

A resolution maps the cache aliases of the independent servers to their
clients and to the ``fanout.Servers`` (with its worker threads) that calls
them at once. It is shared by every ``Redlock`` naming the same aliases, so a
new ``Redlock`` per request costs no thread start, and it is built anew when
Django's settings change (``conf.generation``), like ``backend``'s clients.

The servers must fail independently: ``shared_server`` finds two aliases
whose ``LOCATION`` is one server (check ``E023``, and at first use). A
Redlock's keys are the same on every server, in the namespace of its caches
(``backend.namespace``), so the caches must agree on one: ``namespace_clash``
finds two that do not (check ``E025``, and at first use).

Each server runs the same scripts as ``Lock`` (its acquire in ``try`` mode:
no queue), under its own key parts, so a ``Redlock`` never collides with a
``Lock`` of the same name on a shared server. ``lock_call`` is the one place
their arguments are built.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

import django_redislock.primitives.redlock.fanout as fanout
from django_redislock.backend import client as backend
from django_redislock.backend.scripts import (
    INSPECT_LOCKS,
    LOCK_ACQUIRE,
    LOCK_EXTEND,
    LOCK_PARTS,
    LOCK_RELEASE,
    Script,
)
from django_redislock.backend.values import parse_lock_value
from django_redislock.conf import generation
from django_redislock.engine.steps import Call
from django_redislock.primitives.redlock.fanout import Servers
from django_redislock.primitives.redlock.quorum import quorum, too_few_error

#: Key parts of a Redlock on each server: lock, fence, queue, deadlines.
PARTS = ("redlock", "redlock-fence", "redlock-queue", "redlock-deadlines")


class _Resolutions:
    """``Servers`` and key namespace per tuple of aliases, for the current settings generation.

    No lock: two threads racing here may each build a ``Servers``; one is
    kept, the other is dropped before it starts a thread. (A lock could be held by
    another thread at ``fork()``, and never released in the child.)
    """

    def __init__(self) -> None:
        self._entry: tuple[int, dict[Any, Any]] = (-1, {})

    def _found(self) -> dict[Any, Any]:
        """This settings generation's resolutions (servers by aliases,
        namespaces by aliases and prefix)."""
        current = generation()
        owner, found = self._entry
        if owner != current:
            found = {}
            self._entry = (current, found)
        return found

    def namespace(self, aliases: tuple[str, ...], key_prefix: str) -> str:
        found = self._found()
        space: str | None = found.get((aliases, key_prefix))
        if space is None:
            self.get(aliases)  # an unknown alias is E003, not a namespace of ""
            spaces = {alias: backend.namespace(alias, key_prefix) for alias in aliases}
            clash = namespace_clash(spaces)
            if clash is not None:
                raise ImproperlyConfigured(f"(django_redislock.E025) {clash}")
            space = found[(aliases, key_prefix)] = spaces[aliases[0]]
        return space

    def get(self, aliases: tuple[str, ...]) -> Servers:
        found = self._found()
        servers: Servers | None = found.get(aliases)
        if servers is None:
            from django.conf import settings

            shared = shared_server(aliases, getattr(settings, "CACHES", {}))
            if shared is not None:
                raise ImproperlyConfigured(f"(django_redislock.E023) {shared}")
            servers = found.setdefault(aliases, Servers([backend.get_client(a) for a in aliases]))
        return servers


_resolutions = _Resolutions()


def servers_for(aliases: tuple[str, ...]) -> Servers:
    """The ``Servers`` of these cache aliases (shared, see the module docstring)."""
    return _resolutions.get(aliases)


def namespace_for(aliases: tuple[str, ...], key_prefix: str) -> str:
    """The namespace of a Redlock's keys: the one its caches share (``E025``
    when they do not)."""
    return _resolutions.namespace(aliases, key_prefix)


def namespace_clash(spaces: Mapping[str, str]) -> str | None:
    """Why the caches of a Redlock's aliases (``alias -> namespace``) cannot
    hold its keys, or ``None``.

    Its keys are one name on every server; caches with different
    ``KEY_PREFIX`` or ``VERSION`` would each put them elsewhere, and no choice
    among them would be the one both sites sharing these servers expect."""
    first, space = next(iter(spaces.items()))
    for alias, other in spaces.items():
        if other != space:
            return (
                f"Redlock cache aliases {first!r} and {alias!r} have different KEY_PREFIX "
                f"or VERSION (lock keys under {space!r} and {other!r}); a Redlock's keys are "
                f"one name on every server, so its caches must share one namespace."
            )
    return None


def check_aliases(using: object) -> tuple[str, ...] | None:
    """``using``: ``None`` (``REDISLOCK["REDLOCK"]``) or at least three distinct aliases."""
    if using is None:
        return None
    if isinstance(using, str) or not isinstance(using, Sequence):
        raise TypeError(
            f"using must be a list of cache aliases of independent Redis servers, not {using!r}."
        )
    aliases = tuple(using)
    if not all(isinstance(a, str) and a for a in aliases):
        raise TypeError(f"using must hold non-empty cache alias strings, got {list(aliases)!r}.")
    if len(aliases) < 3 or len(set(aliases)) != len(aliases):
        raise ValueError(f"using needs at least 3 distinct cache aliases, got {list(aliases)!r}.")
    return aliases


#: Names of this machine's loopback interface, taken as one host.
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def first_url(location: object) -> str | None:
    """A cache ``LOCATION``'s first URL (of a list, or of one string with
    commas: the primary), or ``None`` when it holds none."""
    if isinstance(location, list | tuple):
        location = location[0] if location else None
    return location.split(",")[0].strip() if isinstance(location, str) else None


def server_of(location: object) -> str | None:
    """The server a cache's ``LOCATION`` writes to, as ``host:port`` or
    ``unix:<path>``; ``None`` when it cannot tell.

    The database number is left out: two databases of one server fail
    together. With several URLs (a list, or commas) the first is the primary.
    """
    first = first_url(location)
    if first is None:
        return None
    try:
        url = urlsplit(first)
        port = url.port
    except ValueError:
        return None
    if url.scheme == "unix":
        return f"unix:{os.path.normpath(url.path)}" if url.path else None
    if url.scheme not in ("redis", "rediss") or not url.hostname:
        return None
    host = "localhost" if url.hostname in LOOPBACK else url.hostname
    return f"{host}:{port or 6379}"


def _sentinel_deployment(location: object, sentinels: object) -> str | None:
    """A Sentinel-watched primary: its service name and its sentinels."""
    first = first_url(location)
    if first is None or not isinstance(sentinels, list | tuple):
        return None
    service = urlsplit(first).hostname or first
    watchers = sorted(
        f"{s[0]}:{s[1]}" for s in sentinels if isinstance(s, list | tuple) and len(s) >= 2
    )
    return f"Sentinel service {service!r} watched by {', '.join(watchers)}"


def shared_server(aliases: Sequence[str], caches: Mapping[str, Any]) -> str | None:
    """Why two of ``aliases`` are one server (their ``LOCATION``), or ``None``.

    A quorum of servers that share a failure is no quorum: one restart of
    that server can drop a majority's grants and let a second holder in."""
    seen: dict[str, str] = {}
    for alias in aliases:
        config = caches.get(alias)
        if not isinstance(config, Mapping):
            continue
        options = config.get("OPTIONS") or {}
        sentinels = options.get("SENTINELS") if isinstance(options, Mapping) else None
        if sentinels:
            # LOCATION names the service (often "mymaster" everywhere), not a
            # server: a deployment is its service and its sentinels
            server = _sentinel_deployment(config.get("LOCATION"), sentinels)
        else:
            server = server_of(config.get("LOCATION"))
        if server is None:
            continue
        if server in seen:
            return (
                f"Redlock cache aliases {seen[server]!r} and {alias!r} are the same Redis "
                f"server ({server}); a Redlock's servers must fail independently, and "
                f"another database number on one server does not make another server."
            )
        seen[server] = alias
    return None


def key_list(prefix: str, name: str) -> list[str]:
    return [backend.key(prefix, name, part) for part in PARTS]


def lock_call(
    script: Script, keys: Sequence[str], token: str, *, lease_ms: int = 0, holder: str = ""
) -> Call:
    """The call of a ``Lock`` script (acquire, release or extend) for a Redlock
    with ``keys`` (``key_list``) and ``token``: the one place its arguments
    are built."""
    named = by_name(keys)
    if script is LOCK_ACQUIRE:
        args = LOCK_ACQUIRE.args_of(
            token=token,
            lease_ms=lease_ms,
            mode="try",
            fenced=1,
            holder=holder,
            since_ms=int(time.time() * 1000),
            waiter_ttl_ms=0,
            stats_ttl_ms=0,
        )
        return Call(script, LOCK_ACQUIRE.keys_of(named), args)
    if script is LOCK_RELEASE:
        # a Redlock hold has one level (no nesting): its release is always the last
        args = LOCK_RELEASE.args_of(token=token, final=1)
        return Call(script, LOCK_RELEASE.keys_of(named), args)
    if script is LOCK_EXTEND:
        return Call(
            script, LOCK_EXTEND.keys_of(named), LOCK_EXTEND.args_of(token=token, lease_ms=lease_ms)
        )
    raise ValueError(f"Redlock does not run {script.name}")


def by_name(keys: Sequence[str]) -> dict[str, str]:
    """Redlock's keys (``key_list``) by the Lock scripts' names for them
    (``scripts.LOCK_ACQUIRE``): the same scripts, with every key sent."""
    return dict(zip(LOCK_PARTS[:4], keys, strict=True))


#: How long ``Redlock.locked``, ``owned`` and ``ttl`` wait for any one server.
INSPECT_TIMEOUT = 0.5


def view(servers: Servers, key: str, name: str) -> tuple[list[tuple[bytes | None, int]], int]:
    """Each answering server's ``(value, pttl)`` of ``key`` and how many make
    a majority; ``LockBackendError`` when fewer answered. Every server is
    asked at once, each reply awaited ``INSPECT_TIMEOUT`` at most: one hung
    server must not hold up (with no socket timeout, for ever) a question a
    majority can answer."""
    states = fanout.run_on_all(
        servers,
        INSPECT_LOCKS,
        INSPECT_LOCKS.keys_of_each([{"lock": key}]),
        INSPECT_LOCKS.args_of_each([{}]),
        timeout=INSPECT_TIMEOUT,
    )
    answered = [(s[0], int(s[1])) for s in states if not isinstance(s, BaseException)]
    if len(answered) < quorum(len(states)):
        raise too_few_error(name, states, "inspect")
    return answered, quorum(len(states))


def by_token(answered: list[tuple[bytes | None, int]]) -> dict[str, list[int]]:
    """The lease left (ms) on each server, by the token that holds it there."""
    found: dict[str, list[int]] = {}
    for value, pttl in answered:
        state = parse_lock_value(value)
        if state is not None:
            found.setdefault(state.token, []).append(pttl)
    return found


def majority_holder(answered: list[tuple[bytes | None, int]], needed: int) -> list[int] | None:
    """``by_token``'s entry of the one holder ``needed`` servers answered for;
    ``None`` when nobody has a majority (free, or a split vote its contenders
    are about to undo)."""
    return next((p for p in by_token(answered).values() if len(p) >= needed), None)
