"""What every single-name primitive shares: its options, its settings resolved
once per settings generation (``Resolved``: client, keys, lease), its holding's
extend, and the sync and asyncio ``with`` blocks.

The claim itself (token, lease, renewal, loss) is ``holds/holding.py``'s; the
fair acquire and its wait are ``engine/steps.py``'s; the error wording and the
sync ``with`` block are ``primitives/guarded.py``'s, shared with ``MultiLock``
and ``Redlock``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from django_redislock.backend import client as backend
from django_redislock.conf import LockSettings, generation, get_settings
from django_redislock.engine import drivers
from django_redislock.engine import steps as protocol
from django_redislock.engine.steps import AcquireResult, Call, Step
from django_redislock.exceptions import LockBackendError, LockError, LockLostError
from django_redislock.holds.holding import Holding
from django_redislock.primitives.guarded import Worded
from django_redislock.validation import (
    Options,
    check_alias,
    check_lease,
    check_name,
    fixed,
    wait_budget,
)

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script

logger = logging.getLogger(__name__)

#: A queued waiter that has not re-checked for this long past its wait chunk is
#: presumed dead and skipped, so a killed waiter never blocks the queue for long.
WAITER_GRACE_MS = 1000


#: How many (class, name, options) resolutions ``_RESOLVED`` keeps before it
#: starts over.
RESOLVED_NAMES = 1024

# --- primitives ------------------------------------------------------------------


class Resolved:
    """A primitive's settings, client and keys, as of one Django settings object.

    Every acquire needs them; looking each up anew (settings, then the client
    cache, then the keys) was a fifth of an uncontended cycle's client time.
    """

    __slots__ = (
        "_key_lists",
        "alias",
        "auto_renew",
        "chunk",
        "client",
        "generation",
        "hold_key",
        "keys",
        "lease",
        "lease_ms",
        "script_keys",
        "settings",
        "sigprefix",
        "stats_key",
        "wire_keys",
        "wire_sigprefix",
    )

    def __init__(self, primitive: Primitive, generation: int, settings: LockSettings) -> None:
        self.generation = generation
        self.settings = settings
        self.alias = primitive.using or settings.cache
        self.client, self.chunk = primitive._client_and_chunk(settings)
        self.keys, self.sigprefix = primitive._key_set(primitive._prefix(settings))
        #: What a holder's registry knows a hold of it by (``Handle._hold_key``).
        self.hold_key = (self.alias, self.keys[0])
        # Bytes go to the wire as they are; a str would be encoded on every call.
        self.wire_keys = [k.encode() for k in self.keys]
        self.wire_sigprefix = self.sigprefix.encode()
        #: The keys by part name, as the scripts' call specs take them
        #: (``scripts.Script.keys_of``); no stats key when counting is off.
        sent = primitive.script_parts or primitive.parts
        roles = primitive.roles or primitive.parts
        self.script_keys = {
            role: key
            for part, role, key in zip(primitive.parts, roles, self.wire_keys, strict=True)
            if part in sent and (part != "stats" or settings.stats_ttl_ms)
        }
        self._key_lists: dict[Script, list[bytes]] = {}
        #: Where the usage counters are, when counting is on.
        named = dict(zip(primitive.parts, self.wire_keys, strict=True))
        self.stats_key = named.get("stats") if settings.stats_ttl_ms else None
        self.lease = primitive._lease(settings)
        self.lease_ms = int(self.lease * 1000)
        self.auto_renew = primitive._renews(settings)

    def keys_for(self, script: Script) -> list[bytes]:
        """``script``'s KEYS (``Script.keys_of``), built once per resolution;
        never to be changed by the caller."""
        keys = self._key_lists.get(script)
        if keys is None:
            keys = self._key_lists[script] = script.keys_of(self.script_keys)
        return keys


#: Resolutions shared by primitives of the same class, name and options (see
#: ``Primitive._resolve``); dict reads and writes are atomic, so threads may
#: share it, at worst resolving a name twice.
_RESOLVED: dict[tuple[type, str, tuple[object, ...]], Resolved] = {}


class Primitive(Worded, Options):
    """Options and Redis plumbing common to every primitive.

    Options left as ``None`` are read from ``REDISLOCK`` at each acquire, so a
    primitive built at import time still follows ``override_settings``.
    """

    kind = "primitive"
    #: Key parts this primitive uses, in the order its scripts take them.
    parts: tuple[str, ...] = ()
    #: The parts its scripts are sent (``Resolved.script_keys``; empty: all);
    #: a script may work out the others from these (a Lock's, from its lock key).
    script_parts: tuple[str, ...] = ()
    #: What the scripts' call specs name each part, in the parts' order (empty:
    #: the parts' own names), for parts named apart per primitive ("sem:queue").
    roles: tuple[str, ...] = ()

    # Options are fixed at construction (``validation.fixed``).
    name: str = fixed("name")
    using: str | None = fixed("using")

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        using: str | None = None,
    ) -> None:
        self._name = check_name(name)
        self._set_options(timeout, blocking, blocking_timeout, auto_renew)
        self._using = check_alias(using)
        self._keys: tuple[str, list[str], str] | None = None
        self._resolved: Resolved | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # settings and keys, resolved at use

    def _resolve_options(self) -> tuple[object, ...]:
        """The options ``Resolved`` depends on (fixed at construction)."""
        return (self._timeout, self._auto_renew, self._using)

    def _resolve(self) -> Resolved:
        """Settings, client and keys; built again when Django's settings change.

        Shared by every primitive of the same class, name and options
        (``_RESOLVED``): a view that builds a new ``Lock(f"sku:{pk}")`` per
        request resolves each name once per settings generation, not once
        per request. A ``Resolved`` is never changed after it is built.
        """
        current = generation()
        resolved = self._resolved
        if resolved is not None and resolved.generation == current:
            return resolved
        shared_key = (type(self), self._name, self._resolve_options())
        resolved = _RESOLVED.get(shared_key)
        if resolved is None or resolved.generation != current:
            resolved = Resolved(self, current, get_settings())
            if len(_RESOLVED) >= RESOLVED_NAMES:
                _RESOLVED.clear()  # bounded: names may be unbounded (one per row)
            _RESOLVED[shared_key] = resolved
        self._resolved = resolved
        return resolved

    def _settings(self) -> LockSettings:
        return get_settings()

    def _client(self, settings: LockSettings) -> Any:
        with backend.translate_errors(self.name):  # a cluster client connects when built
            return backend.get_client(self.using or settings.cache)

    def _client_and_chunk(self, settings: LockSettings) -> tuple[Any, float]:
        with backend.translate_errors(self.name):
            return backend.get_client_and_chunk(self.using or settings.cache)

    def _prefix(self, settings: LockSettings) -> str:
        """The key prefix of this primitive's cache alias (``backend.namespace``)."""
        return backend.namespace(self.using or settings.cache, settings.key_prefix)

    def _lease(self, settings: LockSettings) -> float:
        return self.timeout if self.timeout is not None else settings.timeout

    def _renews(self, settings: LockSettings) -> bool:
        return self.auto_renew if self.auto_renew is not None else settings.auto_renew

    def _key_set(self, prefix: str) -> tuple[list[str], str]:
        """All keys of this primitive and the signal-list prefix, for ``prefix``."""
        cached = self._keys
        if cached is not None and cached[0] == prefix:
            return cached[1], cached[2]
        keys = [backend.key(prefix, self.name, part) for part in self.parts]
        sigprefix = backend.key(prefix, self.name, "signal:")
        self._keys = (prefix, keys, sigprefix)
        return keys, sigprefix

    def _wait_budget(
        self, blocking: bool | None, blocking_timeout: float | None, settings: LockSettings
    ) -> tuple[bool, float | None]:
        return wait_budget(self, blocking, blocking_timeout, settings)

    def _extend_steps(
        self, holding: Holding | None, seconds: float | None
    ) -> Generator[Step, Any, None]:
        """``extend()`` of ``holding`` (this holder's, ``None`` when it holds
        nothing), written once for every primitive and driver: ``seconds``
        (default: the lease as it stands) becomes the lease from now on, for the
        watchdog's renewals too. Below 1 ms is a ``ValueError``, before Redis.
        A hold already reported lost (``lock_lost``) stays lost: the watchdog
        has let it go, so an extend that found some lease left would leave it
        to run out unrenewed while its holder believed it extended. That holds
        for a loss reported while the extend was on its way too (a renewal
        unanswered past the lease end)."""
        lease = check_lease(seconds, "seconds")
        if holding is None:
            raise self._not_owned()
        if holding.lost is not None:
            raise self._lost(holding)
        lease = lease or holding.lease
        call = Call(holding.renew_script, *holding.renew_call(lease))
        sent = time.monotonic()
        with holding.extending(lease) as extended:
            try:
                ours = yield from protocol.single(call, self.name)
            except LockBackendError as exc:
                error = self._unreachable(holding, exc, sent, "extended it")
                raise error from error.__cause__
            if ours:
                extended()
        if not ours:
            holding.mark_lost("the lease was gone when the holder extended it")
        if not ours or holding.lost is not None:
            raise self._lost(holding)

    def _unreachable(
        self, holding: Holding, exc: BaseException, sent: float, action: str
    ) -> LockError:
        """The error for a release or extend sent at ``sent`` that Redis did
        not answer (``exc``): ``LockLostError`` when that leaves the hold
        certainly lost (``Holding.lapsed``, which reports it), chained to the
        ``LockBackendError``, else that ``LockBackendError`` (the redis-py
        error chained). Raise it ``from`` its ``__cause__``, set here."""
        error = exc if isinstance(exc, LockBackendError) else backend.backend_error(self.name, exc)
        if error is not exc:
            error.__cause__ = exc
        if not holding.lapsed(sent, action):
            return error
        lost = self._lost(holding)
        lost.__cause__ = error
        return lost


#: A primitive's fencing-token steps for one of its holds (``_fence_steps``).
FenceSteps = Callable[[Holding], Generator[Step, Any, int]]


def token_of(holding: Holding | None, fence_steps: FenceSteps) -> int | None:
    """A hold's fencing token, taken now (one owner-checked round trip, a
    *blocking* one on the hold's synchronous client) when it has none yet:
    ``fencing_token`` of every primitive that takes it on first use."""
    if holding is None:
        return None
    if holding.fencing_token:
        return holding.fencing_token
    return drivers.run(fence_steps(holding), holding.client)


async def token_of_async(holding: Holding | None, fence_steps: FenceSteps) -> int | None:
    """``token_of`` without blocking the event loop (``get_fencing_token``)."""
    if holding is None:
        return None
    if holding.fencing_token:
        return holding.fencing_token
    return await drivers.run_async(fence_steps(holding), drivers.AsyncConnection(holding.client))


_Async = TypeVar("_Async", bound="AsyncPrimitive")


class AsyncPrimitive(Primitive):
    """``async with primitive:``, meaning what the sync ``with`` means (``Guarded``)."""

    async def _acquire(
        self, blocking: bool | None, blocking_timeout: float | None
    ) -> AcquireResult:
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _Async) -> _Async:
        result = await self._acquire(None, None)
        if not result.held:
            raise self._timeout_error(result)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockLostError as error:
            self._exit_error(error, exc_type, exc)
