"""One run at a time of a management command, across every machine: cron's lock.

A cron job scheduled on several hosts, or one that overran its interval,
must not run twice at once. ``@single_run`` on ``handle`` takes a ``Lock``
for the whole run; when another run holds it, the command says so on one
line and exits with ``ALREADY_RUNNING`` (75, ``EX_TEMPFAIL``: "try again
later"), so cron wrappers and monitoring can tell "skipped" from "failed"::

    class Command(BaseCommand):
        @single_run()                      # the lock "command:<name>"
        def handle(self, *args, **options): ...

        @single_run("report:<day>")        # one run per --day value
        def handle(self, *args, **options): ...

The watchdog keeps the lease alive for as long as the run lasts; if the
process dies, the lease (``timeout``) frees the name for the next run.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_redislock.exceptions import LockBackendError, LockError, LockTimeout
from django_redislock.primitives.lock import Lock
from django_redislock.validation import check_alias, check_lease, check_name, check_seconds

logger = logging.getLogger(__name__)

#: The exit status of a run skipped because another run holds the lock
#: (``EX_TEMPFAIL`` from ``sysexits.h``).
ALREADY_RUNNING = 75

Handle = TypeVar("Handle", bound=Callable[..., Any])

_PLACEHOLDER = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")


def single_run(
    name: str | None = None,
    *,
    blocking_timeout: float = 0,
    timeout: float | None = None,
    using: str | None = None,
) -> Callable[[Handle], Handle]:
    """Run the decorated ``BaseCommand.handle`` only while holding a lock.

    ``name``: the lock's name, with ``<option>`` placeholders filled from the
    command's options (default ``"command:<the command's name>"``).
    ``blocking_timeout``: how long a second run waits for the first (default:
    not at all). A run that cannot have the lock in time raises
    ``CommandError`` with ``returncode=ALREADY_RUNNING``: one line on stderr
    and exit status 75 from ``manage.py``; ``call_command`` raises it. Redis
    unreachable, or not answering within ``blocking_timeout``, is a failed
    run, not a skipped one: a ``CommandError`` with the default status 1 (a
    hung Redis's ``LockBackendTimeout`` is also a ``LockTimeout``, which must
    not read as "already running"). So is a lock name that option values
    make unusable.
    """
    if name is not None:
        check_name(name, "name")
    check_seconds(blocking_timeout, "blocking_timeout", allow_none=False, allow_zero=True)
    check_lease(timeout)
    check_alias(using)

    def decorator(handle: Handle) -> Handle:
        @functools.wraps(handle)
        def wrapper(command: BaseCommand, *args: Any, **options: Any) -> Any:
            lock_name = _lock_name(name, command, options)
            lock = Lock(lock_name, timeout=timeout, blocking_timeout=blocking_timeout, using=using)
            _enter(lock, command)
            try:
                result = handle(command, *args, **options)
            except BaseException as exc:
                _release_after_failure(lock, exc)
                raise
            try:
                lock.__exit__(None, None, None)
            except LockError as exc:  # the run is done; its status must say the lock failed
                raise CommandError(
                    f"{_command_name(command)} ran, but its lock {lock_name!r} failed at the "
                    f"end: {exc}"
                ) from exc
            return result

        return cast(Handle, wrapper)

    return decorator


def _enter(lock: Lock, command: BaseCommand) -> None:
    """Take ``lock`` for a run, or say in one line why the run cannot start:
    already running (``ALREADY_RUNNING``), or failed (status 1) when Redis is
    unreachable or does not answer in time."""
    try:
        lock.__enter__()
    except LockBackendError as exc:  # a failed run (status 1), not a skipped one
        raise CommandError(
            f"{_command_name(command)} could not take its lock {lock.name!r}: {exc}"
        ) from exc
    except LockTimeout as exc:
        retry = (
            f"; retry in about {max(1, math.ceil(exc.retry_after))} s" if exc.retry_after else ""
        )
        raise CommandError(
            f"{_command_name(command)} is already running (lock {lock.name!r} is held){retry}.",
            returncode=ALREADY_RUNNING,
        ) from exc


def _release_after_failure(lock: Lock, exc: BaseException) -> None:
    """Release after the run raised ``exc``, which goes on whatever the
    release meets: a Redis failure is logged (the lease frees the lock), not
    raised in place of the run's own error."""
    try:
        lock.__exit__(type(exc), exc, exc.__traceback__)
    except LockError as release_exc:
        logger.error("Could not release %r after a failed run: %s", lock.name, release_exc)


def _command_name(command: BaseCommand) -> str:
    return type(command).__module__.rsplit(".", 1)[-1]


def _lock_name(template: str | None, command: BaseCommand, options: dict[str, Any]) -> str:
    if template is None:
        return f"command:{_command_name(command)}"

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in options:
            raise ImproperlyConfigured(
                f"single_run: placeholder <{key}> in {template!r} is not an option of "
                f"{_command_name(command)!r} (options: {', '.join(sorted(options))})."
            )
        return str(options[key])

    try:
        return check_name(_PLACEHOLDER.sub(fill, template), "lock name")
    except ValueError as exc:  # made from option values: the command line's fault
        raise CommandError(f"{_command_name(command)}: {exc}") from exc
