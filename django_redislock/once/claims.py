"""Enqueue-once claims: a task with a key is queued or running at most once.

A key (``"recalc:<order_id>"``, filled from the task's arguments as
``@require_lock`` fills a lock name) is claimed when the task is enqueued, in
one script that also answers who has it when it is taken (``once_claim.lua``):
the second enqueue is refused, or coalesced into a handle to the first. The
claim is one hash, ``<prefix>:{once:<key>}:once``:

- **queued**: from the enqueue; it lasts ``queued_ttl`` if the task never starts
  (a message lost with its broker must not block the key for ever);
- **running**: the worker's run takes it over with a lease of ``lease``
  seconds, renewed by a heartbeat thread while the task runs, so a worker that
  dies (``SIGKILL``, an OOM kill) lets the key lapse within ``lease``;
- released when the task ends (``release="end"``), or as it starts
  (``release="start"``: one may be queued while another runs);
- **queued** again when a running task sends its own retry (Celery's
  ``self.retry()``, ``once_requeue.lua``): the retry is still the one enqueued.

Each write compares the writer's token in its script, so a run that lost its
claim (its lease ran out under a stalled worker) never releases its
successor's. The frameworks' glue is ``celery.py`` and ``django_tasks.py``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.decorators import NamePlan, parse_template
from django_redislock.exceptions import LockBackendError
from django_redislock.validation import check_alias, check_lease

logger = logging.getLogger(__name__)

#: The claim's key part and its names' prefix: ``<prefix>:{once:<key>}:once``.
PART = "once"
NAME_PREFIX = "once:"
QUEUED, RUNNING = "queued", "running"
Release = Literal["end", "start"]
OnDuplicate = Literal["coalesce", "raise"]


class AlreadyEnqueued(Exception):
    """A task with this key is queued or running (``on_duplicate="raise"``, or
    a backend that cannot hand out the existing task's result)."""

    def __init__(self, key: str, task_id: str | None, state: str) -> None:
        super().__init__(f"A task with key {key!r} is already {state} (id {task_id or 'unknown'}).")
        self.key = key
        self.task_id = task_id
        self.state = state


@dataclass(frozen=True)
class Existing:
    """The task that has a key, as a refused enqueue found it."""

    task_id: str | None
    state: str
    since: float | None
    task: str


@dataclass(frozen=True)
class Once:
    """A task's enqueue-once options, checked when the task is defined."""

    key: str
    release: Release = "end"
    on_duplicate: OnDuplicate = "coalesce"
    lease: float = 30.0
    queued_ttl: float = 3600.0
    using: str | None = None

    def __post_init__(self) -> None:
        parse_template(self.key)
        for option, allowed in (("release", Release), ("on_duplicate", OnDuplicate)):
            value = getattr(self, option)
            if value not in get_args(allowed):
                raise ValueError(
                    f"once: {option} must be one of {get_args(allowed)}, not {value!r}."
                )
        if check_lease(self.lease, "lease") is None:
            raise TypeError("once: lease must be a number of seconds, not None.")
        if check_lease(self.queued_ttl, "queued_ttl") is None:
            raise TypeError("once: queued_ttl must be a number of seconds, not None.")
        check_alias(self.using)

    @classmethod
    def of(cls, options: object) -> Once:
        """``options`` (a ``Once`` or a dict of its fields) as a ``Once``."""
        if isinstance(options, Once):
            return options
        if not isinstance(options, Mapping) or "key" not in options:
            raise TypeError(f'once must be a dict with a "key" template, not {options!r}.')
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"once: unknown option(s) {sorted(unknown)}.")
        return cls(**options)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class Claims:
    """The claims of one task's key template: claimed by enqueues, taken over
    by the runs."""

    def __init__(self, once: Once, func: Callable[..., Any], decorator: str) -> None:
        self.once = once
        self.plan = NamePlan(func, parse_template(once.key), decorator)

    def name(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The claim's name for a call: ``once:`` and the filled template."""
        return NAME_PREFIX + self.plan.name(None, tuple(args), dict(kwargs))

    @contextmanager
    def _claim_key(self, name: str) -> Iterator[tuple[Any, list[str]]]:
        with backend.translate_errors(name):
            settings = get_settings()
            alias = self.once.using or settings.cache
            prefix = backend.namespace(alias, settings.key_prefix)
            yield backend.get_client(alias), [backend.key(prefix, name, PART)]

    def claim(self, name: str, token: str, task_id: str, task: str) -> Existing | None:
        """Claim ``name`` for an enqueue; ``None`` when claimed, else who has it."""
        from django_redislock.backend.scripts import ONCE_CLAIM

        args = ONCE_CLAIM.args_of(
            token=token,
            id=task_id,
            task=task,
            since_ms=int(time.time() * 1000),
            ttl_ms=_ms(self.once.queued_ttl),
        )
        with self._claim_key(name) as (client, keys):
            reply = ONCE_CLAIM(client, keys, args)
        if not reply:
            return None
        found_id, state, since, found_task = (
            None if v is None else backend.as_text(v) for v in reply
        )
        seconds = int(since) / 1000 if since and since.isdigit() else None
        return Existing(found_id or None, state or QUEUED, seconds, found_task or "")

    def bind(self, name: str, token: str, task_id: str) -> None:
        """Record the id a backend gave the task after it was claimed."""
        from django_redislock.backend.scripts import ONCE_BIND

        with self._claim_key(name) as (client, keys):
            ONCE_BIND(client, keys, ONCE_BIND.args_of(token=token, id=task_id))

    def release(self, name: str, field: str, value: str) -> bool:
        from django_redislock.backend.scripts import ONCE_RELEASE

        with self._claim_key(name) as (client, keys):
            return bool(ONCE_RELEASE(client, keys, ONCE_RELEASE.args_of(field=field, value=value)))

    def renew(self, name: str, run: str) -> bool:
        from django_redislock.backend.scripts import ONCE_RENEW

        args = ONCE_RENEW.args_of(run=run, lease_ms=_ms(self.once.lease))
        with self._claim_key(name) as (client, keys):
            return bool(ONCE_RENEW(client, keys, args))

    @contextmanager
    def running(self, name: str, task_id: str, task: str) -> Iterator[Run | None]:
        """The task runs: its claim is leased (renewed until the block ends,
        then released), or released now with ``release="start"``. A Redis
        failure is logged and the task runs all the same: it was dequeued,
        and the claim only keeps copies from being queued. Yields the run
        (``None`` when there is no claim to keep), which a retry the task
        sends of itself hands the claim to (``Run.requeue``)."""
        from django_redislock.backend.scripts import ONCE_START

        run = secrets.token_hex(16)
        at_start = self.once.release == "start"
        args = ONCE_START.args_of(
            run=run,
            id=task_id,
            task=task,
            since_ms=int(time.time() * 1000),
            lease_ms=0 if at_start else _ms(self.once.lease),
        )
        try:
            with self._claim_key(name) as (client, keys):
                ONCE_START(client, keys, args)
        except LockBackendError as exc:
            logger.warning("Could not take the claim %r as its task started: %s", name, exc)
            at_start = True  # nothing to renew or release
        if at_start:
            yield None
            return
        handle = Run(self, name, task_id, run)
        handle.heartbeat.start()
        try:
            yield handle
        finally:
            handle.heartbeat.stop()
            if not handle.handed_over:
                try:
                    self.release(name, "run", run)
                except LockBackendError as exc:  # its lease lets it lapse
                    logger.warning("Could not release the claim %r: %s", name, exc)


class Run:
    """A running task's hold on its claim (``Claims.running``)."""

    def __init__(self, claims: Claims, name: str, task_id: str, token: str) -> None:
        self.claims, self.name, self.task_id, self.token = claims, name, task_id, token
        self.heartbeat = _Heartbeat(claims, name, token)
        #: the claim went to a retry (``requeue``): the run's end leaves it
        self.handed_over = False

    def requeue(self, token: str, delay: float) -> bool:
        """Hand the claim to the retry this run sends of itself: queued again
        (for ``queued_ttl`` past the retry's ``delay``), under the retry's
        enqueue ``token``, no longer this run's to renew or release. ``False``
        when the claim is no longer this run's (cleared, or lapsed)."""
        from django_redislock.backend.scripts import ONCE_REQUEUE

        self.heartbeat.stop()  # a renewal after the hand-over would say the claim was lost
        args = ONCE_REQUEUE.args_of(
            run=self.token,
            token=token,
            since_ms=int(time.time() * 1000),
            ttl_ms=_ms(self.claims.once.queued_ttl + max(0.0, delay)),
        )
        with self.claims._claim_key(self.name) as (client, keys):
            self.handed_over = bool(ONCE_REQUEUE(client, keys, args))
        return self.handed_over


class _Heartbeat:
    """Renews a running task's claim every third of its lease until stopped;
    dies with its process, so the claim then lapses."""

    def __init__(self, claims: Claims, name: str, run: str) -> None:
        self.claims, self.name, self.run = claims, name, run
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._beat, name=f"redislock-once {name}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        interval = self.claims.once.lease / 3
        while not self.stopped.wait(interval):
            try:
                if not self.claims.renew(self.name, self.run):
                    logger.warning("The claim %r was lost (cleared or lapsed).", self.name)
                    return
            except LockBackendError as exc:  # retried at the next beat
                logger.warning("Could not renew the claim %r: %s", self.name, exc)
