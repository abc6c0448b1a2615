"""Settings: one ``REDISLOCK`` dict merged over defaults, read on access.

Nothing is read at import time. The merged value is cached against the identity
of Django's settings object, which ``override_settings`` replaces, so an
override takes effect at once without any signal wiring, and the hot path of an
acquire pays one identity check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "CACHE": "default",
    "KEY_PREFIX": "redislock",
    "TIMEOUT": 30.0,
    "BLOCKING_TIMEOUT": 10.0,
    "AUTO_RENEW": True,
    "REDLOCK": [],
    "STATS": True,
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
    if not isinstance(merged["CACHE"], str) or not merged["CACHE"]:
        problems.append(
            Problem(
                "E003",
                f"REDISLOCK['CACHE'] must be a cache alias (str), not {merged['CACHE']!r}.",
                "Name an alias of CACHES that uses django-redis.",
            )
        )
    prefix = merged["KEY_PREFIX"]
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{}*?[]"):
        problems.append(
            Problem(
                "E005",
                f"REDISLOCK['KEY_PREFIX'] must be a non-empty str without braces or glob "
                f"characters, not {prefix!r}.",
                'Use something like "redislock" or "myshop:locks".',
            )
        )
    timeout = merged["TIMEOUT"]
    if not _is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
        problems.append(
            Problem(
                "E006",
                f"REDISLOCK['TIMEOUT'] must be a positive finite number of seconds, "
                f"not {timeout!r}.",
                "The default lease is 30 seconds.",
            )
        )
    blocking = merged["BLOCKING_TIMEOUT"]
    if blocking is not None and (
        not _is_number(blocking) or not math.isfinite(blocking) or blocking < 0
    ):
        problems.append(
            Problem(
                "E007",
                f"REDISLOCK['BLOCKING_TIMEOUT'] must be None (wait forever) or a "
                f"non-negative finite number of seconds, not {blocking!r}.",
                "The default wait is 10 seconds.",
            )
        )
    if not isinstance(merged["AUTO_RENEW"], bool):
        problems.append(
            Problem(
                "E008",
                f"REDISLOCK['AUTO_RENEW'] must be True or False, not {merged['AUTO_RENEW']!r}.",
                "True (the default) lets the watchdog keep a live holder's lease; "
                "False leaves each lease to run out after TIMEOUT.",
            )
        )
    redlock = merged["REDLOCK"]
    if not isinstance(redlock, list | tuple) or not all(isinstance(a, str) and a for a in redlock):
        problems.append(
            Problem(
                "E009",
                f"REDISLOCK['REDLOCK'] must be a list of cache aliases, not {redlock!r}.",
                "List three or more aliases of independent Redis servers, or leave it empty.",
            )
        )
    elif redlock and (len(redlock) < 3 or len(set(redlock)) != len(redlock)):
        problems.append(
            Problem(
                "E010",
                f"REDISLOCK['REDLOCK'] needs at least 3 distinct aliases, got {list(redlock)!r}.",
                "A quorum of independent masters needs three or more; five is common.",
            )
        )
    stats = merged["STATS"]
    if not isinstance(stats, bool) and (
        not _is_number(stats) or not math.isfinite(stats) or stats < 0.001
    ):
        problems.append(
            Problem(
                "E012",
                f"REDISLOCK['STATS'] must be True, False or a positive number of seconds "
                f"(how long idle counters are kept), not {stats!r}.",
                "False turns the per-name usage counters off; True keeps them for an hour.",
            )
        )
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
