"""Lua scripts, loaded from the ``.lua`` files beside this module and run by SHA.

Scripts get the shared preludes (files starting with ``_``) prepended, or put
at a ``-- @preludes`` line after a fast path, so the lock value format and the
fair wait queue are each written once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

#: Where a script wants the preludes, when not at its top.
PRELUDE_MARK = "-- @preludes\n"
_PRELUDES = ("_lock_value.lua", "_queue.lua", "_permits.lua", "_stats.lua", "_handoff.lua")


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


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

    def __init__(self, filename: str, *, prelude: bool = True) -> None:
        body = _read(filename)
        if prelude:
            shared = "\n".join(_read(p) for p in _preludes_for(body))
            if PRELUDE_MARK in body:  # a fast path first, which needs none of them
                body = body.replace(PRELUDE_MARK, shared, 1)
            else:
                body = shared + "\n" + body
        self.name = filename
        self.text = body
        self.sha = hashlib.sha1(body.encode("utf-8")).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        """Run it through redis-py's public path (``Redis.evalsha``, so
        ``execute_command``: its retries, instrumentation and a client
        subclass's overrides all apply); a ``NOSCRIPT`` reply loads it first."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.text)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def ensure_loaded(self, client: Any) -> None:
        """Load the script unless the server has it; for pipelines, which cannot
        recover from ``NOSCRIPT`` half-way."""
        if not client.script_exists(self.sha)[0]:
            client.script_load(self.text)

    def queue(self, pipe: Any, keys: list[str] | tuple[str, ...], args: list[Any]) -> None:
        """Add a run to ``pipe``; call ``ensure_loaded`` on the client first."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    async def run_async(self, client: Any, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(self.text)
            return await client.evalsha(self.sha, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


LOCK_ACQUIRE = Script("lock_acquire.lua")
LOCK_RELEASE = Script("lock_release.lua")
LOCK_EXTEND = Script("lock_extend.lua")
QUEUE_CANCEL = Script("queue_cancel.lua")
LOCK_CANCEL = Script("lock_cancel.lua")
SEMAPHORE_ACQUIRE = Script("semaphore_acquire.lua")
SEMAPHORE_RELEASE = Script("semaphore_release.lua")
RWLOCK_ACQUIRE = Script("rwlock_acquire.lua")
RWLOCK_RELEASE = Script("rwlock_release.lua")
PERMIT_EXTEND = Script("permit_extend.lua")
PERMIT_DESCRIBE = Script("permit_describe.lua")
PERMIT_CLEAR = Script("permit_clear.lua")
REDLOCK_FENCE = Script("redlock_fence.lua")
CLEAR_LOCK = Script("clear_lock.lua")
INSPECT_LOCKS = Script("inspect_locks.lua", prelude=False)
