"""Argument checks shared by every primitive, the decorator and the checks.

Each names the argument and what was given, so a bad value is a one-line
``TypeError`` or ``ValueError`` at construction, never a Redis error later.
"""

from __future__ import annotations

import math
import operator
import unicodedata
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django_redislock.conf import LockSettings

#: Longest accepted name, in characters. Keys stay small and readable in tools.
MAX_NAME_LENGTH = 1024


def check_name(name: object, argument: str = "name") -> str:
    if type(name) is str and 0 < len(name) <= MAX_NAME_LENGTH and name.isprintable():
        return name  # the common case, checked first: a name per request
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, not {type(name).__name__}.")
    if not name:
        raise ValueError(f"{argument} must not be empty.")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{argument} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}."
        )
    if name.isprintable():  # no control character nor lone surrogate (the common case)
        return name
    for char in name:
        category = unicodedata.category(char)
        if category in ("Cc", "Cs"):
            raise ValueError(
                f"{argument} must not contain control characters or lone surrogates; "
                f"found {char!r} in {name[:60]!r}."
            )
    return name


_NUMBERS = (int, float)

#: The shortest lease: Redis counts leases in whole milliseconds.
MIN_LEASE = 0.001
#: The longest lease, a year. Far longer ones are not what Redis or the
#: watchdog take (``PX`` past the server's range is a Redis error, and every
#: script call and renewal with it would fail, losing a live hold), and are
#: a unit mistake more often than a wish.
MAX_LEASE = 365 * 24 * 3600.0


def check_lease(value: object, argument: str = "timeout") -> float | None:
    seconds = check_seconds(value, argument)
    if seconds is not None and seconds < MIN_LEASE:
        raise ValueError(f"{argument} must be at least {MIN_LEASE} s (1 ms), got {value!r}.")
    if seconds is not None and seconds > MAX_LEASE:
        raise ValueError(f"{argument} must be at most {MAX_LEASE:.0f} s (a year), got {value!r}.")
    return seconds


def check_seconds(
    value: object, argument: str, *, allow_none: bool = True, allow_zero: bool = False
) -> float | None:
    if type(value) is float or type(value) is int:  # the common case first
        if 0 < value <= MAX_LEASE:
            return float(value)
    elif value is None:
        if allow_none:
            return None
        raise TypeError(f"{argument} must be a number of seconds, not None.")
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}.")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float: no number of seconds
        raise ValueError(f"{argument} must be finite, got an int too large for a float.") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be finite, got {value!r}.")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{argument} must be {bound}, got {value!r}.")
    return seconds


def check_bool(value: object, argument: str, *, allow_none: bool = True) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, not {value!r}.")
    return value


def check_alias(value: object) -> str | None:
    """``using``, checked against ``CACHES`` when Django's settings are ready.

    An unknown alias used to pass here and fail at the first acquire, which a
    view answers with a 500, while every other bad argument fails at once.
    Before the settings are configured (a module imported ahead of them) it
    is checked at first use instead (``backend.client``'s E003).
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"using must be a cache alias (non-empty str), not {value!r}.")
    if settings.configured:
        caches = getattr(settings, "CACHES", None) or {}
        if value not in caches:
            defined = ", ".join(map(repr, caches)) or "none"
            raise ImproperlyConfigured(
                f"using={value!r} is not a cache alias defined in CACHES (defined: {defined})."
            )
    return value


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
    if blocking is None and blocking_timeout is None:  # the common case: the owner's own
        if not owner.blocking:
            return False, 0.0
        budget = owner.blocking_timeout
        if budget is None:
            budget = settings.blocking_timeout
        return budget != 0.0, budget
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


def fixed(option: str) -> Any:
    """A primitive's option, read like an attribute (from ``_<option>``), fixed
    when the primitive is built.

    What a primitive resolved from its options (keys, client, lease) is shared
    with every primitive of the same class, name and options, so an option
    changed later would be silently ignored, or would change other handles:
    assigning one raises instead. Reads stay a C-level attribute fetch.
    """

    def refuse(primitive: object, value: object) -> None:
        kind = type(primitive).__name__
        raise AttributeError(
            f"{kind}.{option} is fixed when the {kind} is built; "
            f"make a new {kind}(..., {option}={value!r}) instead."
        )

    return property(operator.attrgetter(f"_{option}"), refuse, doc=f"The ``{option}`` option.")


def checked_options(
    timeout: float | None,
    blocking: bool,
    blocking_timeout: float | None,
    auto_renew: bool | None,
) -> tuple[float | None, bool, float | None, bool | None]:
    """The waiting and lease options every primitive takes (``Lock``,
    ``Semaphore``, ``Redlock``, ``MultiLock``...), checked once when it is
    built: its ``_timeout``, ``_blocking``, ``_blocking_timeout`` and
    ``_auto_renew``, which its ``fixed`` options read."""
    lease, wait = type(timeout), type(blocking_timeout)
    if (  # the common case, checked at once; anything else by the checks below
        (
            timeout is None
            or ((lease is float or lease is int) and MIN_LEASE <= timeout <= MAX_LEASE)
        )
        and (
            blocking_timeout is None
            or ((wait is float or wait is int) and 0 <= blocking_timeout <= MAX_LEASE)
        )
        and type(blocking) is bool
        and (auto_renew is None or type(auto_renew) is bool)
    ):
        return (
            None if timeout is None else float(timeout),
            blocking,
            None if blocking_timeout is None else float(blocking_timeout),
            auto_renew,
        )
    return (
        check_lease(timeout),
        bool(check_bool(blocking, "blocking", allow_none=False)),
        check_seconds(blocking_timeout, "blocking_timeout", allow_zero=True),
        check_bool(auto_renew, "auto_renew"),
    )
