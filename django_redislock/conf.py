"""Settings: one ``REDISLOCK`` dict merged over defaults, read on access.

Nothing is read at import time. The merged value is built once and dropped on
``setting_changed`` for ``REDISLOCK`` or ``CACHES`` (``override_settings`` sends
it), so an override takes effect at once and an acquire reads a cached object.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_redislock.validation import MAX_LEASE, MIN_LEASE

DEFAULTS: dict[str, Any] = {
    "CACHE": "default",
    "KEY_PREFIX": "redislock",
    "TIMEOUT": 30.0,
    "BLOCKING_TIMEOUT": 10.0,
    "AUTO_RENEW": True,
    "REDLOCK": [],
    "STATS": True,
    "RENEWAL_BATCH": 256,
    "MAX_HOLD": None,
}


@dataclass(frozen=True)
class LockSettings:
    cache: str
    key_prefix: str
    timeout: float
    blocking_timeout: float | None
    auto_renew: bool
    redlock: tuple[str, ...]
    stats: bool = True
    #: How long a name's usage counters live after their TTL was last refreshed,
    #: in ms; 0 when counting is off.
    stats_ttl_ms: int = 3_600_000
    #: The most lease renewals the watchdog sends in one Redis call.
    renewal_batch: int = 256
    #: Seconds after its acquire the watchdog stops renewing a hold (``None``: never).
    max_hold: float | None = None


#: ``STATS = True`` keeps a name's counters for an hour after its last activity.
DEFAULT_STATS_TTL = 3600.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with ``REDISLOCK``; ``id`` is the system check id suffix."""

    id: str
    msg: str
    hint: str


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]


def _check_cache(value: Any) -> Problem | None:
    if isinstance(value, str) and value:
        return None
    return Problem(
        "E003",
        f"REDISLOCK['CACHE'] must be a cache alias (str), not {value!r}.",
        "Name an alias of CACHES that uses django-redis.",
    )


def _check_key_prefix(value: Any) -> Problem | None:
    if isinstance(value, str) and value and not any(c in value for c in "{}*?[]"):
        return None
    return Problem(
        "E005",
        f"REDISLOCK['KEY_PREFIX'] must be a non-empty str without braces or glob "
        f"characters, not {value!r}.",
        'Use something like "redislock" or "myshop:locks".',
    )


def _check_timeout(value: Any) -> Problem | None:
    if _finite(value) and MIN_LEASE <= value <= MAX_LEASE:
        return None
    return Problem(
        "E006",
        f"REDISLOCK['TIMEOUT'] must be a number of seconds from {MIN_LEASE} (1 ms) to "
        f"{MAX_LEASE:.0f} (a year), not {value!r}.",
        "The default lease is 30 seconds.",
    )


def _check_blocking_timeout(value: Any) -> Problem | None:
    if value is None or (_finite(value) and value >= 0):
        return None
    return Problem(
        "E007",
        f"REDISLOCK['BLOCKING_TIMEOUT'] must be None (wait forever) or a "
        f"non-negative finite number of seconds, not {value!r}.",
        "The default wait is 10 seconds.",
    )


def _check_auto_renew(value: Any) -> Problem | None:
    if isinstance(value, bool):
        return None
    return Problem(
        "E008",
        f"REDISLOCK['AUTO_RENEW'] must be True or False, not {value!r}.",
        "True (the default) lets the watchdog keep a live holder's lease; "
        "False leaves each lease to run out after TIMEOUT.",
    )


def _check_redlock(value: Any) -> Problem | None:
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) and a for a in value):
        return Problem(
            "E009",
            f"REDISLOCK['REDLOCK'] must be a list of cache aliases, not {value!r}.",
            "List three or more aliases of independent Redis servers, or leave it empty.",
        )
    if value and (len(value) < 3 or len(set(value)) != len(value)):
        return Problem(
            "E010",
            f"REDISLOCK['REDLOCK'] needs at least 3 distinct aliases, got {list(value)!r}.",
            "A quorum of independent masters needs three or more; five is common.",
        )
    return None


def _check_stats(value: Any) -> Problem | None:
    if isinstance(value, bool) or (_finite(value) and 0.001 <= value <= MAX_LEASE):
        return None
    return Problem(
        "E012",
        f"REDISLOCK['STATS'] must be True, False or a positive number of seconds, at "
        f"most a year (how long idle counters are kept), not {value!r}.",
        "False turns the per-name usage counters off; True keeps them for an hour.",
    )


def _check_renewal_batch(value: Any) -> Problem | None:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10_000:
        return None
    return Problem(
        "E026",
        f"REDISLOCK['RENEWAL_BATCH'] must be a whole number from 1 to 10000 (lease "
        f"renewals per Redis call), not {value!r}.",
        "The default, 256, keeps one call around a millisecond of the server's time.",
    )


def _check_max_hold(value: Any) -> Problem | None:
    if value is None or (_finite(value) and 0 < value <= MAX_LEASE):
        return None
    return Problem(
        "E029",
        f"REDISLOCK['MAX_HOLD'] must be None (no cap) or a positive finite number of "
        f"seconds, at most a year, not {value!r}.",
        "The watchdog stops renewing a hold that long after its acquire; None (the "
        "default) renews a live holder for as long as it holds.",
    )


#: One check per key, in the order of ``DEFAULTS``; each says what is wrong with
#: its value, so ``manage.py check`` and the first use report the same problems.
_CHECKS: dict[str, Callable[[Any], Problem | None]] = {
    "CACHE": _check_cache,
    "KEY_PREFIX": _check_key_prefix,
    "TIMEOUT": _check_timeout,
    "BLOCKING_TIMEOUT": _check_blocking_timeout,
    "AUTO_RENEW": _check_auto_renew,
    "REDLOCK": _check_redlock,
    "STATS": _check_stats,
    "RENEWAL_BATCH": _check_renewal_batch,
    "MAX_HOLD": _check_max_hold,
}


def validate(raw: object) -> list[Problem]:
    """Return every problem with a ``REDISLOCK`` value that needs no server to see."""
    if not isinstance(raw, Mapping):
        return [
            Problem(
                "E001",
                f"REDISLOCK must be a dict, not {type(raw).__name__}.",
                "Set REDISLOCK = {...} with the keys listed in the settings reference.",
            )
        ]
    problems = []
    unknown = sorted(str(k) for k in raw if k not in DEFAULTS)
    if unknown:
        problems.append(
            Problem(
                "E002",
                f"REDISLOCK has unknown key(s): {', '.join(unknown)}.",
                f"Valid keys are {', '.join(DEFAULTS)}.",
            )
        )
    merged = {**DEFAULTS, **raw}
    for key, check in _CHECKS.items():
        problem = check(merged[key])
        if problem is not None:
            problems.append(problem)
    return problems


def _stats_ttl_ms(value: bool | float) -> int:
    if value is False:
        return 0
    seconds = DEFAULT_STATS_TTL if value is True else float(value)
    return max(1, int(seconds * 1000))


class _SettingsCache:
    """The merged settings, built once and dropped when ``REDISLOCK`` or
    ``CACHES`` change (``setting_changed``: ``override_settings`` sends it).

    ``generation`` counts the changes, so whatever was resolved from the
    settings (a primitive's client and keys, the client per alias) is rebuilt
    when it no longer matches.
    """

    def __init__(self) -> None:
        self._value: LockSettings | None = None
        self.generation = 0

    def get(self) -> LockSettings:
        value = self._value
        return value if value is not None else self._build()

    def clear(self) -> None:
        self._value = None
        self.generation += 1

    def _build(self) -> LockSettings:
        generation = self.generation
        raw = getattr(django_settings, "REDISLOCK", None)
        source: object = {} if raw is None else raw
        problems = validate(source)
        if problems:
            detail = " ".join(f"(django_redislock.{p.id}) {p.msg}" for p in problems)
            raise ImproperlyConfigured(detail)
        assert isinstance(source, Mapping)
        merged = {**DEFAULTS, **source}
        blocking = merged["BLOCKING_TIMEOUT"]
        value = LockSettings(
            cache=merged["CACHE"],
            key_prefix=merged["KEY_PREFIX"],
            timeout=float(merged["TIMEOUT"]),
            blocking_timeout=None if blocking is None else float(blocking),
            auto_renew=merged["AUTO_RENEW"],
            redlock=tuple(merged["REDLOCK"]),
            stats=merged["STATS"] is not False,
            stats_ttl_ms=_stats_ttl_ms(merged["STATS"]),
            renewal_batch=merged["RENEWAL_BATCH"],
            max_hold=None if merged["MAX_HOLD"] is None else float(merged["MAX_HOLD"]),
        )
        if generation == self.generation:  # not changed again while building
            self._value = value
        return value


_cache = _SettingsCache()


def get_settings() -> LockSettings:
    """The current settings; raises ``ImproperlyConfigured`` when they are invalid."""
    return _cache.get()


def generation() -> int:
    """Bumped whenever ``REDISLOCK`` or ``CACHES`` change: what was resolved
    from the settings under an older generation must be resolved again."""
    return _cache.generation


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("REDISLOCK", "CACHES"):
        _cache.clear()
