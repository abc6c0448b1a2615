"""Driving protocol steps by hand (``engine/steps.py``): a clock the test
moves, and ``send``/``throw`` that turn the generator's return into ``Done``."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_CANCEL, Script
from django_redislock.engine.steps import Attempt, Call, Wait, acquire_reply

#: Where every test's clock starts (``time.monotonic()``).
T0 = 1000.0
#: ``time.time()`` at ``T0``.
WALL_T0 = 1_800_000_000.0

#: The keys, signal list and leave of ``attempt``'s acquire.
KEYS = [b"rl:{q}:lock"]
SIGNAL = b"rl:{q}:signal:t1"
LEAVE = Call(LOCK_CANCEL, KEYS, ["t1"])


class Clock:
    """``time.monotonic()`` and ``time.time()`` that move only when told."""

    def __init__(self) -> None:
        self.now = T0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return WALL_T0 + self.now - T0

    def advance(self, seconds: float) -> None:
        self.now += seconds


def use_clock(monkeypatch: pytest.MonkeyPatch, *modules: str) -> Clock:
    """A ``Clock`` as the ``time`` of ``modules``, by dotted path (theirs only:
    threads elsewhere keep real time)."""
    clock = Clock()
    for module in modules:
        monkeypatch.setattr(f"{module}.time", clock)
    return clock


@dataclass(frozen=True)
class Done:
    """The steps returned ``value``."""

    value: Any


def send(gen: Generator[Any, Any, Any], reply: Any = None) -> Any:
    """The next step after ``reply``, or ``Done`` with what the steps returned."""
    try:
        return gen.send(reply)
    except StopIteration as stop:
        return Done(stop.value)


def throw(gen: Generator[Any, Any, Any], error: BaseException) -> Any:
    """The next step after the step raised ``error``, or ``Done``."""
    try:
        return gen.throw(error)
    except StopIteration as stop:
        return Done(stop.value)


def refused(hint_ms: int) -> int:
    """The lock acquire script's reply for a refusal with ``hint_ms`` to wait."""
    return -2 - hint_ms


def named(call: Call) -> dict[str, Any]:
    """``call``'s ARGV by its script's names (an optional tail may be left out)."""
    return dict(zip(call.script.arg_names, call.args, strict=False))


def assert_call(
    step: Any,
    script: Script,
    *,
    keys: Any = None,
    args: Any = None,
    deadline: Any = ...,
    shield: bool = False,
    background: bool = False,
) -> None:
    """``step`` is a ``Call`` of ``script`` with these flags (and ``keys``,
    ``args`` and ``deadline`` when given)."""
    assert isinstance(step, Call), step
    assert step.script is script, step
    if keys is not None:
        assert list(step.keys) == list(keys), step
    if args is not None:
        assert list(step.args) == list(args), step
    if deadline is not ...:
        assert step.deadline == deadline, step
    assert (step.shield, step.background) == (shield, background), step


def attempt(
    *,
    deadline: float | None = None,
    may_wait: bool = True,
    handoff_lease: float = 0.0,
    chunk: float = 2.0,
    recheck: bool = True,
) -> Attempt:
    """A Lock-shaped attempt: its re-checks (``on_wait``) carry their number."""
    rechecks: list[Call] = []

    def on_wait() -> Call:
        rechecks.append(Call(LOCK_ACQUIRE, KEYS, ["t1", "wait", len(rechecks) + 1]))
        return rechecks[-1]

    return Attempt(
        name="q",
        call=Call(LOCK_ACQUIRE, KEYS, ["t1", "wait"]),
        parse=acquire_reply,
        leave=LEAVE,
        undo=LEAVE,
        signal_key=SIGNAL,
        chunk=chunk,
        may_wait=may_wait,
        deadline=deadline,
        handoff_lease=handoff_lease,
        on_wait=on_wait if recheck else None,
    )


def queued(gen: Any, hint_ms: int = 2000) -> Wait:
    """Start ``gen``, refuse its first attempt: it queues and waits."""
    assert_call(next(gen), LOCK_ACQUIRE)
    wait = send(gen, refused(hint_ms))
    assert isinstance(wait, Wait)
    return wait
