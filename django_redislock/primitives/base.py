"""What every single-name primitive shares: its settings resolved once per
settings generation (``Resolved``: client, keys, lease), its holding's extend
and release outcome, and its loss API (``primitives/told.py``).

The claim itself (token, lease, renewal, loss) is ``holds/holding.py``'s; the
fair acquire and its wait are ``engine/steps.py``'s; the options, the error
wording and the sync and asyncio ``with`` blocks are ``primitives/guarded.py``'s,
shared with ``MultiLock`` and ``Redlock``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from django_redislock.backend import client as backend
from django_redislock.conf import LockSettings, generation, get_settings
from django_redislock.engine import drivers
from django_redislock.engine import steps as protocol
from django_redislock.engine.steps import Call, Step
from django_redislock.exceptions import LockBackendError, LockError
from django_redislock.holds.holding import Holding
from django_redislock.primitives import told
from django_redislock.primitives.guarded import Worded
from django_redislock.validation import (
    check_alias,
    check_lease,
    check_name,
    checked_options,
    fixed,
    wait_budget,
)

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script
    from django_redislock.holds.losses import LossOptions

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
        "max_hold",
        "release_keys",
        "renew_keys",
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
        #: ``REDISLOCK["MAX_HOLD"]``: what caps a hold whose handle sets no ``max_hold``.
        self.max_hold = settings.max_hold
        #: The KEYS of the primitive's release and renewal scripts, when it
        #: names them: what every hold of the resolution is built with.
        release, renew = primitive.release_script, primitive.renew_script
        self.release_keys = self.keys_for(release) if release is not None else []
        self.renew_keys = self.keys_for(renew) if renew is not None else []

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


class Primitive(Worded):
    """The Redis plumbing common to every single-name primitive (``Lock``,
    ``Semaphore``, ``ReadWriteLock`` and their asyncio twins).

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
    #: Its release and renewal scripts, when every hold has the same KEYS
    #: for them (``Resolved.release_keys``, ``renew_keys``).
    release_script: Script | None = None
    renew_script: Script | None = None

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
        self._timeout, self._blocking, self._blocking_timeout, self._auto_renew = checked_options(
            timeout, blocking, blocking_timeout, auto_renew
        )
        self._using = check_alias(using)
        self._keys: tuple[str, list[str], str] | None = None
        self._resolved: Resolved | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # what the holder is told of a loss while it holds: primitives/told.py

    #: ``on_lost``, ``max_hold``, ``cancel_on_loss`` (``holds/losses.py``), set by
    #: a subclass's ``__init__`` only when given: a handle without them costs nothing.
    _loss: LossOptions | None = None
    #: Whether its holds belong to asyncio tasks (``cancel_on_loss`` applies).
    asyncio_holds = False

    @property
    def on_lost(self) -> Any:
        """The ``on_lost`` option: called once with this handle when a hold's lease is lost."""
        return self._loss.on_lost if self._loss is not None else None

    @property
    def max_hold(self) -> float | None:
        """The ``max_hold`` option (``None``: ``REDISLOCK["MAX_HOLD"]`` applies)."""
        return self._loss.max_hold if self._loss is not None else None

    @property
    def cancel_on_loss(self) -> bool:
        """The ``cancel_on_loss`` option (asyncio holds only)."""
        return self._loss is not None and self._loss.cancel_on_loss

    @property
    def lost(self) -> bool:
        """Whether the current holder's hold through this handle is known lost
        (no round trip; see ``told.lost``)."""
        return told.lost(self)

    def check(self) -> None:
        """Raise ``LockLostError`` if ``lost``; otherwise do nothing (no round trip).

        For a long job to call between steps: it stops at the first step after
        the loss rather than at the end of its block."""
        told.check(self)

    def _hold_now(self) -> Holding | None:
        """The current holder's hold through this handle (what ``lost`` tells of)."""
        raise NotImplementedError

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

    def _release_failed(self, holding: Holding) -> None:
        """Redis could not be told of a release (or its answer was lost, or
        it was cancelled): the hold ends here, its lease frees the name."""
        holding.end()

    def _after_release(self, holding: Holding, result: Any) -> None:
        raise NotImplementedError

    def _released(
        self,
        holding: Holding,
        sent: float,
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        """A release's outcome, sent at ``sent`` by whichever driver: the
        script's ``result`` (``_after_release``), or the ``error`` it raised,
        which leaves the level as ``_release_failed`` says. A Redis failure
        is raised as ``_unreachable`` words it (the hold may be certainly
        lost by now); anything else (an interrupt, a cancellation) as it is.
        Written once for every primitive's sync and asyncio release."""
        if error is None:
            self._after_release(holding, result)
            return
        unreachable = None
        if isinstance(error, (LockBackendError, *backend.BACKEND_ERRORS)):
            unreachable = self._unreachable(holding, error, sent, "released it")
        self._release_failed(holding)
        if unreachable is None:
            raise error
        raise unreachable from unreachable.__cause__

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
