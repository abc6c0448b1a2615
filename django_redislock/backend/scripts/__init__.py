"""Lua scripts, loaded from the ``.lua`` files beside this module and run by SHA.

Scripts get the shared preludes (files starting with ``_``) prepended, or put
at a ``-- @preludes`` line after a fast path, so the lock value format and the
fair wait queue are each written once.

Every script carries its call spec: the names of its ``KEYS`` and ``ARGV`` in
order, as its header comment lists them (``-- KEYS[1] lock ...``, one per
line; checked by ``tests/backend/test_script_specs.py``, which also fails on a script
without one). Callers build the lists by name (``keys_of``, ``args_of``,
``Resolved.keys_for``) instead of by position, so no caller splices an index
and a script's arguments change in one place.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from django_redislock.backend import family

#: Where a script wants the preludes, when not at its top.
PRELUDE_MARK = "-- @preludes\n"
_PRELUDES = ("_lock_value.lua", "_queue.lua", "_permits.lua", "_stats.lua", "_handoff.lua")

#: How long a name's fencing counter lives after it was last moved up to the
#: server clock, and how long ago a grant finds it moved at most (``next_fence``
#: in ``_queue.lua``). Defined here, written into the Lua where it says
#: ``{{FENCE_MEMORY_MS}}``: one place for a constant both sides use.
FENCE_MEMORY_MS = 10_000
FENCE_SLACK_MS = 10
LUA_CONSTANTS = {"FENCE_MEMORY_MS": FENCE_MEMORY_MS, "FENCE_SLACK_MS": FENCE_SLACK_MS}

_CONSTANT = re.compile(r"\{\{([A-Z_]+)\}\}")
#: A line a file is written in place of, for code a fast path (which runs
#: before the preludes, and so cannot call them) shares with another script.
_INCLUDE = re.compile(r"^[ \t]*-- @include (_[a-z_]+\.lua)[ \t]*\n", re.MULTILINE)


def _read(filename: str) -> str:
    """A script's text, with its ``-- @include`` lines expanded and the
    ``{{NAME}}`` constants of ``LUA_CONSTANTS`` written in."""
    text = resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
    text = _INCLUDE.sub(lambda match: _read(match.group(1)), text)
    return _CONSTANT.sub(lambda match: str(LUA_CONSTANTS[match.group(1)]), text)


_DEFINED = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def _preludes_for(body: str) -> list[str]:
    """The preludes ``body`` uses, directly or through another prelude.

    Lua runs a script's whole text on every call, so each prelude function
    defined costs a closure per call: a script gets only what it calls.
    """
    texts = {name: _read(name) for name in _PRELUDES}
    defined = {name: set(_DEFINED.findall(text)) for name, text in texts.items()}
    needed: set[str] = set()
    frontier = body
    while True:
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", frontier))
        new = {n for n in _PRELUDES if n not in needed and defined[n] & words}
        if not new:
            return [n for n in _PRELUDES if n in needed]
        needed |= new
        frontier = "\n".join(texts[n] for n in new)


class Script:
    """One Lua script: its text, its SHA1, and how to run it by SHA.

    Runs ``EVALSHA`` and only sends the text (``SCRIPT LOAD``) after a
    ``NOSCRIPT`` reply, which happens once per server, and again after a restart
    or ``SCRIPT FLUSH``.
    """

    #: The most round trips one run takes (``EVALSHA``; after ``NOSCRIPT``,
    #: ``SCRIPT LOAD`` and ``EVALSHA`` again): what bounds it on a hung Redis
    #: is that many socket timeouts (``engine/bounds.Limits.fits``).
    round_trips = 3

    def __init__(
        self,
        filename: str,
        *,
        prelude: bool = True,
        keys: Sequence[str] = (),
        args: Sequence[str] = (),
        optional: Sequence[str] = (),
        per_name: bool = False,
    ) -> None:
        body = _read(filename)
        if prelude:
            shared = "\n".join(_read(p) for p in _preludes_for(body))
            if PRELUDE_MARK in body:  # a fast path first, which needs none of them
                body = body.replace(PRELUDE_MARK, shared, 1)
            else:
                body = shared + "\n" + body
        self.name = filename
        self.text = body
        # The SHA1 is the script's name on the server (EVALSHA), not a
        # security measure: a FIPS-mode hashlib refuses SHA1 unless told so.
        self.sha = hashlib.sha1(body.encode("utf-8"), usedforsecurity=False).hexdigest()
        #: The call spec: KEYS and ARGV names in order; ``optional`` ones may be
        #: left out, and then so must every later one.
        self.key_names = tuple(keys)
        self.arg_names = tuple(args)
        self.optional = frozenset(optional)
        #: The spec is one name's KEYS and ARGV, repeated for each name of a
        #: call (``keys_of_each``, ``args_of_each``): an operator script.
        self.per_name = per_name
        self._arg_set = frozenset(self.arg_names)

    def keys_of(self, keys: Mapping[str, Any]) -> list[Any]:
        """``KEYS`` in the script's order, from a mapping of name -> key (it may hold more)."""
        return _in_order(self, self.key_names, keys)

    def args_of(self, **args: Any) -> list[Any]:
        """``ARGV`` in the script's order, by name; an unknown name is a ``TypeError``."""
        known = self._arg_set.issuperset(args)
        if known and len(args) == len(self.arg_names):  # the common case: every name given
            return [args[name] for name in self.arg_names]
        if not known:
            raise TypeError(f"{self.name} takes no {sorted(set(args) - self._arg_set)}")
        return _in_order(self, self.arg_names, args)

    def keys_of_each(self, names: Iterable[Mapping[str, Any]]) -> list[Any]:
        """A ``per_name`` script's KEYS: each name's (``keys_of``), one name after another."""
        return [key for keys in names for key in self.keys_of(keys)]

    def args_of_each(self, names: Iterable[Mapping[str, Any]]) -> list[Any]:
        """A ``per_name`` script's ARGV: each name's (``args_of``), one name after another."""
        return [arg for args in names for arg in self.args_of(**args)]

    def __call__(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        """Run it through redis-py's public path (``Redis.evalsha``, so
        ``execute_command``: its retries, instrumentation and a client
        subclass's overrides all apply); a ``NOSCRIPT`` reply loads it first
        (the client family's ``NoScriptError``: valkey-py raises its own)."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except family.no_script_errors():
            client.script_load(self.text)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def ensure_loaded(self, client: Any) -> None:
        """Load the script unless the server has it; for pipelines, which cannot
        recover from ``NOSCRIPT`` half-way."""
        if not client.script_exists(self.sha)[0]:
            client.script_load(self.text)

    def queue(self, pipe: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> None:
        """Add a run to ``pipe``; call ``ensure_loaded`` on the client first."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    async def run_async(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except family.no_script_errors():
            await client.script_load(self.text)
            return await client.evalsha(self.sha, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


class Command(Script):
    """One plain Redis command that runs where a ``Script`` does (a protocol
    step, ``engine/steps.Call``, a pipeline), with no Lua: sent as
    ``<command> KEYS... ARGV[0] <flags> ARGV[1:]...`` through
    ``execute_command``, redis-py's public path (its response callback,
    retries and instrumentation apply). A Lock's uncontended acquire,
    ``SET k v NX PX ms``, is
    ``Command("SET", keys=("lock",), args=("value", "ms"), flags=("NX", "PX"))``.
    """

    round_trips = 1

    # no Lua to read: nothing of Script.__init__ applies
    def __init__(
        self, command: str, *, keys: Sequence[str], args: Sequence[str], flags: Sequence[str] = ()
    ) -> None:
        self.name = command
        self.text = ""
        self.sha = ""
        self.command = command
        self.flags = tuple(flags)
        self.key_names = tuple(keys)
        self.arg_names = tuple(args)
        self.optional = frozenset()
        self.per_name = False
        self._arg_set = frozenset(self.arg_names)

    def __call__(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        return client.execute_command(self.command, *keys, args[0], *self.flags, *args[1:])

    def ensure_loaded(self, client: Any) -> None:
        """Nothing to load."""

    def queue(self, pipe: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> None:
        pipe.execute_command(self.command, *keys, args[0], *self.flags, *args[1:])

    async def run_async(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        return await client.execute_command(self.command, *keys, args[0], *self.flags, *args[1:])

    def __repr__(self) -> str:
        return f"<Command {self.command} {' '.join(self.flags)}>"


def _in_order(script: Script, names: tuple[str, ...], given: Mapping[str, Any]) -> list[Any]:
    """``given`` as a list in ``names``' order, stopping at the first absent optional name."""
    out = []
    for name in names:
        if name in given:
            out.append(given[name])
        elif name in script.optional:
            break
        else:
            raise TypeError(f"{script.name} needs {name!r}")
    return out


#: The Lock scripts' keys (``Lock.parts``); stats is left out when counting is off.
#: A Lock's key parts, in the order its scripts name them (``lock_keys`` in
#: ``_lock_value.lua`` derives the others from the first); Redlock's calls send
#: the first four under these names.
LOCK_PARTS = ("lock", "fence", "queue", "deadlines", "stats")
_LOCK_KEYS = LOCK_PARTS
_RELEASE_KEYS = ("lock", "queue", "deadlines", "fence")

LOCK_ACQUIRE = Script(
    "lock_acquire.lua",
    keys=_LOCK_KEYS,
    args=("token", "lease_ms", "mode", "fenced", "holder", "since_ms", "waiter_ttl_ms",
          "stats_ttl_ms", "waited_ms"),
    optional=("fence", "queue", "deadlines", "stats", "waited_ms"),
)  # fmt: skip
LOCK_RELEASE = Script(
    "lock_release.lua",
    keys=_RELEASE_KEYS,
    args=("token", "final"),
    optional=("queue", "deadlines", "fence", "final"),
)
LOCK_FENCE = Script("lock_fence.lua", keys=("lock", "fence"), args=("token",), optional=("fence",))
#: A Lock's uncontended acquire: no script, one plain ``SET NX PX``.
LOCK_TAKE = Command("SET", keys=("lock",), args=("value", "lease_ms"), flags=("NX", "PX"))
LOCK_EXTEND = Script("lock_extend.lua", keys=("lock",), args=("token", "lease_ms"))
#: A hold handed off (``Lock.detach``) and taken over (``Lock.adopt``): the
#: value goes on under the ticket's token, then under the adopter's.
LOCK_DETACH = Script(
    "lock_detach.lua", keys=("lock",), args=("token", "ticket", "lease_ms", "holder")
)
LOCK_ADOPT = Script(
    "lock_adopt.lua", keys=("lock",), args=("ticket", "token", "lease_ms", "holder")
)
#: The watchdog's batch of ``LOCK_EXTEND``s: KEYS one lock each, ARGV the
#: lease then a token per key (``holds/renewals.py``).
LOCK_RENEW = Script("lock_renew.lua", keys=("lock",), args=("lease_ms", "token"))
LOCK_CANCEL = Script(
    "lock_cancel.lua",
    keys=_RELEASE_KEYS,
    args=("token",),
    optional=("queue", "deadlines", "fence"),
)
#: The permit scripts' keys (``PermitBase.roles``, the same for every permit primitive).
_PERMIT_KEYS = ("holders", "fence", "queue", "deadlines")
_PERMIT_ACQUIRE_ARGS = ("member", "lease_ms", "wait_ms", "fenced")
SEMAPHORE_ACQUIRE = Script("semaphore_acquire.lua", keys=_PERMIT_KEYS, args=_PERMIT_ACQUIRE_ARGS)
RWLOCK_ACQUIRE = Script("rwlock_acquire.lua", keys=_PERMIT_KEYS, args=_PERMIT_ACQUIRE_ARGS)
PERMIT_RELEASE = Script(
    "permit_release.lua", keys=("holders", "queue", "deadlines"), args=("member",)
)
#: A permit's fencing token on first use (as ``LOCK_FENCE`` is a Lock's).
PERMIT_FENCE = Script("permit_fence.lua", keys=("holders", "fence"), args=("member",))
PERMIT_CANCEL = Script(
    "permit_cancel.lua",
    keys=("holders", "queue", "deadlines"),
    args=("token", "limit"),
    optional=("limit",),
)
PERMIT_EXTEND = Script("permit_extend.lua", keys=("holders",), args=("token", "lease_ms"))
#: The watchdog's batch of ``PERMIT_EXTEND``s, as ``LOCK_RENEW`` is of ``LOCK_EXTEND``.
PERMIT_RENEW = Script("permit_renew.lua", keys=("holders",), args=("lease_ms", "token"))
PERMIT_DESCRIBE = Script("permit_describe.lua", keys=("holders", "queue"))
PERMIT_CLEAR = Script(
    "permit_clear.lua", keys=("holders", "queue", "deadlines"), args=("sigprefix", "confirmed")
)
REDLOCK_FENCE = Script("redlock_fence.lua", keys=("lock", "fence"), args=("token", "fencing_token"))
CLEAR_LOCK = Script(
    "clear_lock.lua",
    keys=("lock", "queue", "deadlines"),
    args=("confirmed",),
    per_name=True,
)
INSPECT_LOCKS = Script("inspect_locks.lua", prelude=False, keys=("lock",), per_name=True)
#: A new waiter's nudge to its process's shared wake-up connection (``engine/wakeups.py``).
WAKE = Script("wake.lua", prelude=False, keys=("control",), args=("ttl_ms",))

#: ``@idempotent``'s stored response, written or dropped by its own attempt
#: (``once/store.py``); the enqueue-once claims of ``once/claims.py``.
IDEMPOTENCY_SETTLE = Script(
    "idempotency_settle.lua",
    prelude=False,
    keys=("record",),
    args=("owner", "ttl_ms", "fields"),
    optional=("fields",),
)
ONCE_CLAIM = Script(
    "once_claim.lua",
    prelude=False,
    keys=("claim",),
    args=("token", "id", "task", "since_ms", "ttl_ms"),
)
ONCE_BIND = Script("once_bind.lua", prelude=False, keys=("claim",), args=("token", "id"))
ONCE_START = Script(
    "once_start.lua",
    prelude=False,
    keys=("claim",),
    args=("run", "id", "task", "since_ms", "lease_ms"),
)
ONCE_RENEW = Script("once_renew.lua", prelude=False, keys=("claim",), args=("run", "lease_ms"))
ONCE_RELEASE = Script("once_release.lua", prelude=False, keys=("claim",), args=("field", "value"))
#: A running Celery task's own retry keeps its claim (``once/celery.py``).
ONCE_REQUEUE = Script(
    "once_requeue.lua",
    prelude=False,
    keys=("claim",),
    args=("run", "token", "since_ms", "ttl_ms"),
)
#: An operator's clear of a record or a claim (``ops/once.py``).
ONCE_CLEAR = Script("once_clear.lua", prelude=False, keys=("record",), args=("field", "confirmed"))
