"""Which servers a ``Redlock`` uses, and the lock-script calls it makes there.

A resolution maps the cache aliases of the independent servers to their
clients and to the ``fanout.Servers`` (with its worker threads) that calls
them at once. It is shared by every ``Redlock`` naming the same aliases, so a
new ``Redlock`` per request costs no thread start, and it is built anew when
Django's settings change (``conf.generation``), like ``backend``'s clients.

Each server runs the same scripts as ``Lock`` (its acquire in ``try`` mode:
no queue), under its own key parts, so a ``Redlock`` never collides with a
``Lock`` of the same name on a shared server. ``lock_call`` is the one place
their arguments are built.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from . import backend
from .conf import generation
from .fanout import Servers
from .protocol import Call
from .scripts import LOCK_ACQUIRE, LOCK_EXTEND, LOCK_RELEASE, Script

#: Key parts of a Redlock on each server: lock, fence, queue, deadlines.
PARTS = ("redlock", "redlock-fence", "redlock-queue", "redlock-deadlines")


class _Resolutions:
    """``Servers`` per tuple of aliases, for the current settings generation.

    No lock: two threads racing here may each build a ``Servers``; one is
    kept, the other is dropped before it starts a thread. (A lock could be held by
    another thread at ``fork()``, and never released in the child.)
    """

    def __init__(self) -> None:
        self._entry: tuple[int, dict[tuple[str, ...], Servers]] = (-1, {})

    def get(self, aliases: tuple[str, ...]) -> Servers:
        current = generation()
        owner, found = self._entry
        if owner != current:
            found = {}
            self._entry = (current, found)
        servers = found.get(aliases)
        if servers is None:
            servers = found.setdefault(aliases, Servers([backend.get_client(a) for a in aliases]))
        return servers


_resolutions = _Resolutions()


def servers_for(aliases: tuple[str, ...]) -> Servers:
    """The ``Servers`` of these cache aliases (shared, see the module docstring)."""
    return _resolutions.get(aliases)


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
    return dict(zip(("lock", "fence", "queue", "deadlines"), keys, strict=True))
