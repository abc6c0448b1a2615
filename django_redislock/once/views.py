"""``@idempotent``: a retried request runs once, its repeats get its response.

The flow of one request with an ``Idempotency-Key`` (``attempts.py``):

1. A stored response for the key (``store.py``) is replayed, or answered 422
   when the body differs; no lock is taken.
2. Otherwise the key's ``Lock`` is tried without waiting: held by another
   request, the answer is 409 with ``Retry-After`` (422 if its body differs).
3. Held, the record is read again (the first may have finished in between),
   marked running, and the view runs.
4. Its response is stored while the lock is still held: at once outside a
   transaction; under ``ATOMIC_REQUESTS`` (or any ``atomic()``) once the
   transaction has committed, by the hand-over that releases the lock after it
   (``transactions.hand_over``'s ``on_end``). A rollback stores nothing, and
   nor does a 5xx, a streaming response or one over ``MAX_STORED_BYTES``: a
   retry runs again.

A Redis outage answers 503 as ``@require_lock`` does (``responses.Answers``).
The limit: a process killed after its transaction committed and before the
response was stored leaves the key to run again once its lease ends.
"""

from __future__ import annotations

import functools
import inspect
import logging
import secrets
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpResponse, HttpResponseBase
from django.template.response import SimpleTemplateResponse

import django_redislock.once.answers as answers
from django_redislock import guards, responses, transactions
from django_redislock.context import describing_request
from django_redislock.decorators import NamePlan
from django_redislock.exceptions import LockBackendError, LockError, LockLostError
from django_redislock.once.attempts import Attempt, BadKey, attempt_of
from django_redislock.once.store import Record, Snapshot, Store
from django_redislock.primitives.async_lock import AsyncLock
from django_redislock.primitives.lock import Lock
from django_redislock.validation import check_alias, check_lease

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_METHODS = ("POST", "PUT", "PATCH", "DELETE")
#: Largest body stored for replay; a larger response is sent, not stored.
MAX_STORED_BYTES = 1024 * 1024
#: Answers that tell the client to try again (the request timed out, a lock
#: was busy or lost, too many requests): stored, they would refuse every retry.
RETRY_STATUSES = frozenset({408, 409, 423, 425, 429})
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def idempotent(
    *,
    ttl: float = 86400,
    required: bool = False,
    methods: Iterable[str] = DEFAULT_METHODS,
    using: str | None = None,
) -> Callable[[F], F]:
    """Run a view once per ``Idempotency-Key``: repeats get the first response.

    The key is the request's ``Idempotency-Key`` header, scoped by the
    authenticated user (or none), method and path, with a digest of the body.
    The first request runs under a ``Lock`` on the key until its response is
    stored; a repeat after it finished gets that response replayed (status,
    body, headers but cookies) with ``Idempotent-Replayed: true``; a repeat
    while it runs gets 409 with ``Retry-After``; the same key with another
    body gets 422; no key gets 400 with ``required``, else runs as if
    undecorated. Requests of other ``methods`` are not looked at.

    Stored responses live ``ttl`` seconds. 5xx answers, those that ask for a
    retry (``RETRY_STATUSES``: 408, 409, 423, 425, 429), exceptions,
    rolled-back transactions, streaming responses and bodies over
    ``MAX_STORED_BYTES`` store nothing (the last two say so in
    ``Idempotent-Not-Stored``): a retry runs again. Redis unreachable: 503.
    ``using``: the cache alias (default ``REDISLOCK['CACHE']``). See docs/once.md.
    """
    seconds = check_lease(ttl, "ttl")
    if seconds is None:
        raise TypeError("idempotent: ttl must be a number of seconds, not None.")
    if not isinstance(required, bool):
        raise TypeError(f"idempotent: required must be a bool, not {required!r}.")
    wanted = _check_methods(methods)
    check_alias(using)

    def decorator(func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(f"idempotent cannot decorate {func.__qualname__}(), a generator.")
        view = _Idempotent(func, Store(using, seconds), required, wanted, using)
        if iscoroutinefunction(func):

            async def _async_view(*args: Any, **kwargs: Any) -> Any:
                return await view.call_async(*args, **kwargs)

            return cast(F, markcoroutinefunction(functools.wraps(func)(_async_view)))

        def _view(*args: Any, **kwargs: Any) -> Any:
            return view.call(*args, **kwargs)

        return cast(F, functools.wraps(func)(_view))

    return decorator


def _check_methods(methods: object) -> frozenset[str]:
    if isinstance(methods, str) or not isinstance(methods, Iterable):
        raise TypeError(f"idempotent: methods must be a tuple of HTTP methods, not {methods!r}.")
    wanted = tuple(methods)
    bad = [m for m in wanted if not isinstance(m, str) or not m or set(m) - _TOKEN_CHARS]
    if bad or not wanted:
        raise ValueError(
            f"idempotent: methods must be upper-case HTTP methods such as 'POST', not {wanted!r}."
        )
    return frozenset(wanted)


class _Idempotent:
    """One decorated view: the sync and async calls are twins."""

    def __init__(
        self,
        func: Callable[..., Any],
        store: Store,
        required: bool,
        methods: frozenset[str],
        using: str | None,
    ) -> None:
        self.func = func
        self.plan = NamePlan(func, [], "idempotent")  # finds the request among the arguments
        self.store = store
        self.required = required
        self.methods = methods
        self.using = using
        self.outage = responses.Answers(
            on_contention=None, on_backend_error=None, timeout=None, using=using
        )

    def _attempt(self, args: tuple[Any, ...]) -> tuple[Any, Attempt | None, Any]:
        """The request, its attempt (``None``: run undecorated) and an early answer."""
        request = self.plan.request_of(args)
        if request is None:
            name = getattr(self.func, "__qualname__", repr(self.func))
            raise TypeError(f"idempotent decorates views; {name}() was called without a request.")
        if request.method not in self.methods:
            return request, None, None
        try:
            attempt = attempt_of(request)
        except BadKey as exc:
            return request, None, answers.malformed(request, str(exc))
        if attempt is None and self.required:
            return request, None, answers.missing(request)
        return request, attempt, None

    def call(self, *args: Any, **kwargs: Any) -> Any:
        request, attempt, answer = self._attempt(args)
        if answer is not None:
            return answer
        if attempt is None:
            return self.func(*args, **kwargs)
        owner = secrets.token_hex(16)
        try:  # an alias not in CACHES fails here if the settings were not ready before
            lock = Lock(attempt.name, blocking=False, using=self.using)
            answer = self._enter(request, attempt, lock, owner)
        except ImproperlyConfigured as exc:
            return self.outage.misconfigured(request, exc)
        except LockBackendError as exc:
            return self.outage.unavailable(request, exc)
        if answer is not None:
            return answer
        try:
            response = self.func(*args, **kwargs)
            snapshot, reason = _snapshot(request, response)  # renders: may raise too
        except BaseException:
            self._drop(attempt, owner)
            _release(lock)
            raise
        return self._finish(request, lock, attempt, owner, response, snapshot, reason)

    def _enter(self, request: Any, attempt: Attempt, lock: Lock, owner: str) -> Any:
        """The answer when the view is not to run; ``None`` once it holds the key."""
        answer = _answer(request, attempt, self.store.read(attempt.name))
        if answer is not None:
            return answer
        with describing_request(request):
            if not lock.acquire():
                record = self.store.read(attempt.name)
                return _answer(request, attempt, record) or answers.running(request)
        try:
            answer = _answer(request, attempt, self.store.read(attempt.name))
            if answer is None:
                self.store.begin(attempt, owner)
        except BaseException:
            _release(lock)
            raise
        if answer is not None:
            _release(lock)
        return answer

    def _finish(
        self,
        request: Any,
        lock: Lock,
        attempt: Attempt,
        owner: str,
        response: Any,
        snapshot: Snapshot | None,
        reason: str,
    ) -> Any:
        if snapshot is None:
            self._drop(attempt, owner)
            _release(lock)
            return _marked(response, reason)
        settle = functools.partial(self._settle, attempt, owner, snapshot)
        if not _in_transaction():
            settle(True)
            _release(lock)
            return response
        if transactions.hand_over(lock, on_end=settle):
            return response  # stored after the commit, then released
        self._drop(attempt, owner)  # its lease was lost while the view ran
        try:
            lock.release()
        except LockLostError as exc:
            return self.outage.lost(request, exc, rolled_back=guards._roll_back())
        except LockBackendError as exc:  # its lease frees the key; the answer stands
            logger.warning("Could not release the idempotency key's lock %r: %s", lock.name, exc)
        return response

    def _settle(self, attempt: Attempt, owner: str, snapshot: Snapshot, committed: bool) -> None:
        try:
            if not self.store.settle(attempt, owner, snapshot if committed else None):
                logger.warning(
                    "The response to %s %s (%s) was not stored: another attempt had taken over "
                    "the key after this one's lease was lost.",
                    attempt.method,
                    attempt.path,
                    attempt.name,
                )
        except LockBackendError as exc:
            logger.warning(
                "Could not store the response to %s %s (%s); a retry will run again: %s",
                attempt.method,
                attempt.path,
                attempt.name,
                exc,
            )

    def _drop(self, attempt: Attempt, owner: str) -> None:
        try:
            self.store.settle(attempt, owner, None)
        except LockBackendError as exc:  # the record says running: a retry takes it over
            logger.warning("Could not drop the attempt %s: %s", attempt.name, exc)

    async def call_async(self, *args: Any, **kwargs: Any) -> Any:
        request, attempt, answer = self._attempt(args)
        if answer is not None:
            return answer
        if attempt is None:
            return await self.func(*args, **kwargs)
        owner = secrets.token_hex(16)
        try:
            lock = AsyncLock(attempt.name, blocking=False, using=self.using)
            answer = await self._enter_async(request, attempt, lock, owner)
        except ImproperlyConfigured as exc:
            return self.outage.misconfigured(request, exc)
        except LockBackendError as exc:
            return self.outage.unavailable(request, exc)
        if answer is not None:
            return answer
        try:
            response = await self.func(*args, **kwargs)
            snapshot, reason = await _io(_snapshot)(request, response)
        except BaseException:
            await _io(self._drop)(attempt, owner)
            await _release_async(lock)
            raise
        if snapshot is None:
            await _io(self._drop)(attempt, owner)
        else:  # an async view runs in no transaction of its own
            await _io(self._settle)(attempt, owner, snapshot, True)
        await _release_async(lock)
        return response if snapshot is not None else _marked(response, reason)

    async def _enter_async(
        self, request: Any, attempt: Attempt, lock: AsyncLock, owner: str
    ) -> Any:
        answer = _answer(request, attempt, await _io(self.store.read)(attempt.name))
        if answer is not None:
            return answer
        with describing_request(request):
            if not await lock.acquire():
                record = await _io(self.store.read)(attempt.name)
                return _answer(request, attempt, record) or answers.running(request)
        try:
            answer = _answer(request, attempt, await _io(self.store.read)(attempt.name))
            if answer is None:
                await _io(self.store.begin)(attempt, owner)
        except BaseException:
            await _release_async(lock)
            raise
        if answer is not None:
            await _release_async(lock)
        return answer


def _io(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``'s Redis calls off the event loop's thread."""
    return sync_to_async(func, thread_sensitive=False)


def _answer(request: Any, attempt: Attempt, record: Record | None) -> HttpResponseBase | None:
    """What the key's record answers: its response replayed, 422 for another
    body, or ``None`` (nothing stored: the lock decides)."""
    if record is None:
        return None
    if record.fingerprint != attempt.fingerprint:
        return answers.mismatch(request)
    return record.snapshot.replay() if record.snapshot is not None else None


def _snapshot(request: Any, response: Any) -> tuple[Snapshot | None, str]:
    """The response to store, or ``None`` and why not."""
    if not isinstance(response, HttpResponseBase):
        return None, "not a response"
    if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
        return None, ""  # not said: a retry of a failure runs again, as it should
    if response.streaming:
        return None, "streaming"
    unrendered = isinstance(response, SimpleTemplateResponse) and not response.is_rendered
    if unrendered and not _render(request, cast(SimpleTemplateResponse, response)):
        return None, "not rendered"
    if not isinstance(response, HttpResponse):
        return None, "not a response"
    if len(response.content) > MAX_STORED_BYTES:
        return None, "too large"
    return Snapshot.of(response), ""


def _render(request: Any, response: SimpleTemplateResponse) -> bool:
    """Render a template or DRF response now, to store it; DRF's returned by
    an ``APIView`` handler gets the renderer ``finalize_response`` would give it."""
    drf = sys.modules.get("rest_framework.response")
    drf_response = drf is not None and isinstance(response, drf.Response)
    if drf_response and getattr(response, "accepted_renderer", None) is None:
        renderer = getattr(request, "accepted_renderer", None)
        if renderer is None:
            return False
        response.accepted_renderer = renderer  # type: ignore[attr-defined]
        response.accepted_media_type = request.accepted_media_type  # type: ignore[attr-defined]
        view = (getattr(request, "parser_context", None) or {}).get("view")
        context = view.get_renderer_context() if view is not None else {}
        response.renderer_context = context  # type: ignore[attr-defined]
    response.render()
    return True


def _marked(response: Any, reason: str) -> Any:
    if reason and isinstance(response, HttpResponseBase):
        response[answers.NOT_STORED_HEADER] = reason
    return response


def _in_transaction() -> bool:
    return any(
        transactions._in_transaction(connection)
        for connection in connections.all(initialized_only=True)
    )


def _release(lock: Lock) -> None:
    try:
        lock.release()
    except LockError as exc:  # lost or unreachable: its lease frees the key
        logger.warning("Releasing idempotency key %r: %s", lock.name, exc)


async def _release_async(lock: AsyncLock) -> None:
    try:
        await lock.release()
    except LockError as exc:
        logger.warning("Releasing idempotency key %r: %s", lock.name, exc)
