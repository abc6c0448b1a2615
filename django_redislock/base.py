"""What every primitive shares: argument checks, holder state, the fair wait loop.

A *holding* is one holder's claim on a primitive: its unguessable token, its
nesting depth, its fencing token and lease. Holdings belong to one thread (sync)
or one task (async) of one process; a holding seen from another process (after
``fork()``) is ignored, so a child never releases or renews its parent's claim.

Waiting is event driven: a waiter queues itself in the acquire script, then
blocks on its own signal list with ``BLPOP``; the release script pushes to the
list of the first waiter. Each ``BLPOP`` is bounded by the holder's remaining
lease and by the connection's socket timeout, so a lost wake-up or a dead
holder costs at most the rest of the lease, and a blocking command never
outlives the socket timeout.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Hashable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from . import backend, context, signals
from .conf import LockSettings, _wrapped_settings, get_settings
from .exceptions import LockLostError, LockNotOwnedError, LockTimeout
from .watchdog import watchdog

if TYPE_CHECKING:
    from .backend import Template
    from .scripts import Script

logger = logging.getLogger(__name__)

#: Longest accepted name, in characters. Keys stay small and readable in tools.
MAX_NAME_LENGTH = 1024
#: A queued waiter that has not re-checked for this long past its wait chunk is
#: presumed dead and skipped, so a killed waiter never blocks the queue for long.
WAITER_GRACE_MS = 1000
#: How long a name's fencing counter lives after it is (re)created. A new
#: counter starts at the server clock in µs, so forgetting never goes backwards.
FENCE_MEMORY_MS = 10_000


# --- argument checks ------------------------------------------------------------


def check_name(name: object, argument: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, not {type(name).__name__}.")
    if not name:
        raise ValueError(f"{argument} must not be empty.")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{argument} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}."
        )
    for char in name:
        category = unicodedata.category(char)
        if category in ("Cc", "Cs"):
            raise ValueError(
                f"{argument} must not contain control characters or lone surrogates; "
                f"found {char!r} in {name[:60]!r}."
            )
    return name


#: The shortest lease: Redis counts leases in whole milliseconds.
MIN_LEASE = 0.001


def check_lease(value: object, argument: str = "timeout") -> float | None:
    seconds = check_seconds(value, argument)
    if seconds is not None and seconds < MIN_LEASE:
        raise ValueError(f"{argument} must be at least {MIN_LEASE} s (1 ms), got {value!r}.")
    return seconds


def check_seconds(
    value: object, argument: str, *, allow_none: bool = True, allow_zero: bool = False
) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{argument} must be a number of seconds, not None.")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}.")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{argument} must be finite, got {value!r}.")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{argument} must be {bound}, got {value!r}.")
    return float(value)


def check_bool(value: object, argument: str, *, allow_none: bool = True) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, not {value!r}.")
    return value


def check_alias(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"using must be a cache alias (non-empty str), not {value!r}.")
    return value


@functools.cache
def _hostname() -> str:
    return socket.gethostname()


_T = TypeVar("_T")

#: How many callers (modes x holder descriptions) ``Resolved.per_caller`` keeps.
TEMPLATE_CACHE_SIZE = 16

#: The process's id, asked anew each time: fork-time hooks do not run
#: everywhere (uWSGI without ``py-call-osafterfork``).
current_pid = os.getpid


@functools.cache
def _holder_prefix(pid: int) -> str:
    return f"{_hostname()}:{pid}:"


def holder_description() -> str:
    """Who holds a lock, for operators: ``host:pid:thread``, then ``" | "`` and
    what it runs when known (``context.current``)."""
    who = _holder_prefix(os.getpid()) + threading.current_thread().name
    what = context.current()
    return who if what is None else who + context.SEPARATOR + what


class _WaitOptions(Protocol):
    blocking: bool
    blocking_timeout: float | None


def wait_budget(
    owner: _WaitOptions,
    blocking: bool | None,
    blocking_timeout: float | None,
    settings: LockSettings,
) -> tuple[bool, float | None]:
    """Resolve per-call overrides of ``owner``'s options: (may wait, seconds to
    wait or ``None`` for ever)."""
    if blocking is None:
        blocking = owner.blocking
    else:
        check_bool(blocking, "blocking", allow_none=False)
    if blocking_timeout is not None:
        budget = check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    elif owner.blocking_timeout is not None:
        budget = owner.blocking_timeout
    else:
        budget = settings.blocking_timeout
    if not blocking:
        budget = 0.0
    return budget != 0.0, budget


def new_token() -> str:
    return secrets.token_hex(16)


# --- holdings ---------------------------------------------------------------------


class Holding:
    """One holder's claim; also what the watchdog renews."""

    __slots__ = (
        "__weakref__",
        "acquired_at",
        "active",
        "client",
        "depth",
        "fencing_token",
        "keys",
        "kind",
        "lease",
        "lease_deadline",
        "lost",
        "name",
        "pid",
        "release_args",
        "release_packed",
        "releasing",
        "renew_interval",
        "renew_script",
        "sender",
        "sigprefix",
        "stats_key",
        "stats_ttl_ms",
        "token",
    )

    def __init__(
        self,
        *,
        sender: type,
        name: str,
        kind: str,
        token: str,
        client: Any,
        lease: float,
        started: float,
        fencing_token: int | None,
        renew_script: Script,
        keys: Sequence[str | bytes],
        sigprefix: str | bytes = "",
        stats_key: str | bytes | None = None,
        stats_ttl_ms: int = 0,
    ) -> None:
        self.sender = sender
        self.stats_key = stats_key
        self.stats_ttl_ms = stats_ttl_ms
        self.name = name
        self.kind = kind
        self.token = token
        self.client = client
        self.lease = lease
        self.depth = 1
        self.pid = os.getpid()
        self.fencing_token = fencing_token
        self.acquired_at = time.monotonic()
        # Measured from before the request was sent: never later than Redis's view.
        self.lease_deadline = started + lease
        self.renew_interval = lease / 3
        self.renew_script = renew_script
        self.keys = keys
        self.sigprefix = sigprefix
        #: What the primitive's release script takes besides the keys, when
        #: it is the same for every release of this holding.
        self.release_args: list[Any] = []
        #: The release call packed (``Script.template``), where there is one.
        self.release_packed: bytes | None = None
        self.active = True
        self.releasing = False
        self.lost: str | None = None

    def renew(self) -> bool:
        if not self.active:
            return True
        started = time.monotonic()
        with backend.translate_errors(self.name):
            result = self.renew_script(self.client, self.keys, [self.token, int(self.lease * 1000)])
        if result:
            self.lease_deadline = started + self.lease
            return True
        # A release sent while this renewal was on its way may have run first on
        # the server: then "not ours" is the release, not a loss; the release's
        # own answer decides.
        return self.releasing

    def mark_lost(self, reason: str) -> None:
        if not self.active or self.lost is not None:
            return
        self.lost = reason
        self._count_lost()
        signals.notify(
            signals.lock_lost,
            sender=self.sender,
            name=self.name,
            kind=self.kind,
            held=time.monotonic() - self.acquired_at,
            reason=reason,
        )

    def _count_lost(self) -> None:
        """Best effort, one round trip: a lost lease is rare and already a failure."""
        if self.stats_key is None:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(self.stats_key, "lost", 1)
            pipe.pexpire(self.stats_key, self.stats_ttl_ms)
            pipe.execute()
        except backend.BACKEND_ERRORS as exc:
            # Often Redis being unreachable is why the lease was lost; the loss
            # itself is reported through lock_lost and LockLostError.
            logger.debug("Could not count the lost lease of %r: %s", self.name, exc)

    def end(self) -> None:
        """Stop renewing; the holding is over, however it ended."""
        self.active = False
        watchdog.unwatch(self)


# --- primitives ------------------------------------------------------------------


class Resolved:
    """A primitive's settings, client and keys, as of one Django settings object.

    Every acquire needs them; looking each up anew (settings, then the client
    cache, then the keys) was a fifth of an uncontended cycle's client time.
    """

    __slots__ = (
        "auto_renew",
        "chunk",
        "client",
        "keys",
        "lease",
        "lease_ms",
        "memo",
        "options",
        "settings",
        "sigprefix",
        "wire_keys",
        "wire_sigprefix",
        "wrapped",
    )

    def __init__(self, primitive: Primitive, wrapped: object, settings: LockSettings) -> None:
        self.wrapped = wrapped
        self.options = primitive._resolve_options()
        self.settings = settings
        self.client, self.chunk = primitive._client_and_chunk(settings)
        self.keys, self.sigprefix = primitive._key_set(settings.key_prefix)
        # Bytes go to the wire as they are; a str would be encoded on every call.
        self.wire_keys = [k.encode() for k in self.keys]
        self.wire_sigprefix = self.sigprefix.encode()
        self.lease = primitive._lease(settings)
        self.lease_ms = int(self.lease * 1000)
        self.auto_renew = primitive._auto_renew(settings)
        #: Values a primitive derives from the above, kept as long as they are.
        self.memo: dict[str, Any] = {}

    def per_caller(self, table: str, caller: Hashable, build: Callable[..., _T], *args: Any) -> _T:
        """``build(*args)``, kept in ``memo[table]`` per ``caller`` (a mode and a
        holder description); the table is emptied when many thread names fill it."""
        kept: dict[Hashable, _T] | None = self.memo.get(table)
        if kept is None:
            kept = self.memo[table] = {}
        else:
            value = kept.get(caller)
            if value is not None:
                return value
            if len(kept) > TEMPLATE_CACHE_SIZE:
                kept.clear()
        value = kept[caller] = build(*args)
        return value


class Primitive:
    """Options and Redis plumbing common to every primitive.

    Options left as ``None`` are read from ``REDISLOCK`` at each acquire, so a
    primitive built at import time still follows ``override_settings``.
    """

    kind = "primitive"
    #: Key parts this primitive uses, in the order its scripts take them.
    parts: tuple[str, ...] = ()

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
        self.name = check_name(name)
        self.timeout = check_lease(timeout)
        self.blocking = bool(check_bool(blocking, "blocking", allow_none=False))
        self.blocking_timeout = check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
        self.auto_renew = check_bool(auto_renew, "auto_renew")
        self.using = check_alias(using)
        self._keys: tuple[str, list[str], str] | None = None
        self._resolved: Resolved | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # settings and keys, resolved at use

    def _templates(
        self,
        resolved: Resolved,
        acquire_script: Script,
        args: list[Any],
        release_script: Script,
        release_keys: list[bytes],
        release_rest: list[Any],
    ) -> tuple[Template, Template]:
        """Templates of the acquire call (holes: the token, ARGV[1], and the
        timestamp, ARGV[8]) and of the release call (hole: its first argument,
        then ``release_rest``). Every other argument is fixed per settings, mode
        and holder description (ARGV[3], ARGV[6]): callers keep them with
        ``Resolved.per_caller``. Lock and permit scripts share that argument
        layout."""
        return (
            acquire_script.template(resolved.wire_keys, [None, *args[1:7], None, *args[8:]]),
            release_script.template(release_keys, [None, *release_rest]),
        )

    def _resolve_options(self) -> tuple[object, ...]:
        """The attributes ``Resolved`` depends on (users may change them)."""
        return (self.timeout, self.auto_renew, self.using)

    def _resolve(self) -> Resolved:
        """Settings, client and keys; built again when Django's settings or this
        primitive's options change."""
        wrapped = _wrapped_settings()
        resolved = self._resolved
        if (
            resolved is not None
            and resolved.wrapped is wrapped
            and resolved.options == self._resolve_options()
        ):
            return resolved
        resolved = self._resolved = Resolved(self, wrapped, get_settings())
        return resolved

    def _settings(self) -> LockSettings:
        return get_settings()

    # signals: the keyword arguments are built only when someone listens

    def _announce_acquired(self, waited: float, fencing_token: int | None) -> None:
        if signals.lock_acquired.receivers:
            signals.notify(
                signals.lock_acquired,
                sender=type(self),
                name=self.name,
                kind=self.kind,
                waited=waited,
                fencing_token=fencing_token,
            )

    def _announce_released(self, holding: Holding) -> None:
        if signals.lock_released.receivers:
            signals.notify(
                signals.lock_released,
                sender=type(self),
                name=self.name,
                kind=self.kind,
                held=time.monotonic() - holding.acquired_at,
            )

    def _announce_contended(self, begun: float) -> None:
        if signals.lock_contended.receivers:
            signals.notify(
                signals.lock_contended,
                sender=type(self),
                name=self.name,
                kind=self.kind,
                waited=time.monotonic() - begun,
            )

    def _client(self, settings: LockSettings) -> Any:
        return backend.get_client(self.using or settings.cache)

    def _client_and_chunk(self, settings: LockSettings) -> tuple[Any, float]:
        return backend.get_client_and_chunk(self.using or settings.cache)

    def _lease(self, settings: LockSettings) -> float:
        return self.timeout if self.timeout is not None else settings.timeout

    def _auto_renew(self, settings: LockSettings) -> bool:
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

    # errors, worded the same for every primitive

    def _timeout_error(self, retry_after_ms: int | None) -> LockTimeout:
        retry = retry_after_ms / 1000.0 if retry_after_ms and retry_after_ms > 0 else None
        return LockTimeout(
            f"Could not acquire {self.kind} {self.name!r} in time.",
            name=self.name,
            retry_after=retry,
        )

    def _not_owned(self) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"{self.kind.capitalize()} {self.name!r} is not held by this holder.", name=self.name
        )

    def _lost(self, holding: Holding) -> LockLostError:
        reason = holding.lost or "the lease expired or was cleared before release"
        return LockLostError(
            f"{self.kind.capitalize()} {self.name!r} was lost: {reason}.", name=self.name
        )

    @staticmethod
    def _exit_error(
        error: BaseException, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None:
        """Raise ``error`` from ``__exit__`` unless another exception is already on its way."""
        if exc is None:
            raise error
        if sys.version_info >= (3, 11):
            exc.add_note(f"django-redislock: {error}")


_Sync = TypeVar("_Sync", bound="SyncPrimitive")
_Async = TypeVar("_Async", bound="AsyncPrimitive")


class SyncPrimitive(Primitive):
    """``with primitive:`` for every synchronous primitive.

    Entering acquires or raises ``LockTimeout``; leaving releases, and raises
    ``LockLostError`` if the lease was lost, unless another exception is
    already on its way (then that exception gets a note instead).
    """

    def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> int | None:
        """Acquire; ``None`` when held, else the server's retry hint in ms."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Sync) -> _Sync:
        retry = self._acquire(None, None)
        if retry is not None:
            raise self._timeout_error(retry)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLostError as error:
            self._exit_error(error, exc_type, exc)


class AsyncPrimitive(Primitive):
    """``async with primitive:``, with the same meaning as ``SyncPrimitive``'s ``with``."""

    async def _acquire(self, blocking: bool | None, blocking_timeout: float | None) -> int | None:
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _Async) -> _Async:
        retry = await self._acquire(None, None)
        if retry is not None:
            raise self._timeout_error(retry)
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


def wait_seconds(hint_ms: int, chunk: float, deadline: float | None) -> float:
    """How long one BLPOP may block: the lease hint, the chunk, the deadline."""
    wait = chunk
    if hint_ms > 0:
        wait = min(wait, hint_ms / 1000.0)
    if deadline is not None:
        wait = min(wait, deadline - time.monotonic())
    return max(wait, backend.MIN_WAIT_CHUNK)


#: Status a script answers with when it refused to grant (its value is a retry hint in ms).
REFUSED = 0
#: Status of ``wait_turn`` when a release handed the primitive to the caller
#: while it waited (its value is the fencing token; see ``scripts/_handoff.lua``).
HANDED = 2
#: What a plain wake-up pushes to a waiter's signal list (a handoff pushes a fencing token).
WAKE_UP = (b"1", "1")


def handoff_fresh(started: float, handoff_lease: float) -> bool:
    """Whether a handoff just read can be taken as it is.

    The handoff came after the attempt sent at ``started``, so its first
    lease ends no earlier than ``started + handoff_lease``. With less than a
    quarter of it left (a waiter paused past it) another acquire attempt is
    the safe way: it finds the lock still the waiter's, and sets the full
    lease, or not, and queues it again.
    """
    return handoff_lease > 0 and time.monotonic() - started < 0.75 * handoff_lease


def wait_turn(
    attempt: Callable[[], tuple[int, int]],
    cancel: Callable[[], None],
    *,
    client: Any,
    signal_key: str,
    chunk: float,
    may_wait: bool,
    deadline: float | None,
    name: str,
    undo: Callable[[], object] | None = None,
    handoff_lease: float = 0.0,
    first: tuple[int, int, float] | None = None,
) -> tuple[int, int, float, bool]:
    """The fair wait loop: ``attempt()`` until it answers other than ``REFUSED``.

    ``attempt`` runs the primitive's acquire script, which queues the caller on
    refusal when it may wait. Between attempts the caller blocks on its own
    signal list, bounded by ``wait_seconds``. Returns ``(status, value,
    started, queued)``, where ``started`` is when the last attempt was sent
    (the lease is measured from there). A signal other than a plain wake-up
    is a handoff, with a first lease of ``handoff_lease`` seconds: the status
    is then ``HANDED`` and the value the fencing token (the handoff came after
    that attempt, so its lease is measured from there too). Without
    ``handoff_lease``, or when most of that lease has passed (the caller was
    paused), the next attempt takes the primitive, with its full lease, if it
    is still the caller's. On
    giving up it leaves the queue with ``cancel``; on any exception it tries
    to, and also runs ``undo`` (a compare-and-delete by the caller's token):
    an attempt interrupted after Redis ran it may have been granted, and would
    otherwise hold the primitive for a whole lease with nobody to release it.
    Redis failures become ``LockBackendError``. ``first``: the ``(status,
    value, started)`` of an attempt the caller already made.
    """
    queued = False
    try:
        while True:
            if first is not None:
                (status, value, started), first = first, None
            else:
                started = time.monotonic()
                status, value = attempt()
            if status != REFUSED:
                return int(status), int(value), started, queued
            queued = may_wait
            if not may_wait or (deadline is not None and time.monotonic() >= deadline):
                if queued:
                    cancel()
                return REFUSED, int(value), started, queued
            signal = backend.blpop(client, signal_key, wait_seconds(value, chunk, deadline))
            if (
                signal is not None
                and signal[1] not in WAKE_UP
                and handoff_fresh(started, handoff_lease)
            ):
                return HANDED, int(signal[1]), started, queued
    except BaseException as exc:
        abandon(name, exc, cancel if queued else None, undo)


def abandon(name: str, exc: BaseException, *cleanups: Callable[[], object] | None) -> NoReturn:
    """Clean up after an interrupted or failed acquire, then raise ``exc``
    (a Redis failure as ``LockBackendError``). Clean-ups are best effort: a
    Redis error in one must not replace the original exception."""
    for cleanup in cleanups:
        if cleanup is None:
            continue
        try:
            cleanup()
        except backend.BACKEND_ERRORS as cleanup_exc:
            logger.debug("Could not clean up an interrupted wait on %r: %s", name, cleanup_exc)
    if isinstance(exc, backend.BACKEND_ERRORS):
        raise backend.backend_error(name, exc) from exc
    raise exc
