"""Threads that cannot start, as in a process at its thread, pid or memory limit."""

from __future__ import annotations

import threading
import types
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_redislock.holds.watchdog import Watchdog


def refuse_threads(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> list[threading.Thread]:
    """Make every thread ``modules``' code starts fail to (``RuntimeError``, as
    CPython says "can't start new thread"); the list gets each one refused.

    Every background thread of the package starts through one lifecycle
    (``engine/threads.py``); only those whose target is one of ``modules``'
    code are refused: other threads of the test process start as usual."""
    refused: list[threading.Thread] = []
    names = {module.__name__ for module in modules}

    class Refused(threading.Thread):
        def start(self) -> None:
            target = getattr(self, "_target", None)
            if getattr(target, "__module__", None) not in names:
                super().start()
                return
            refused.append(self)
            raise RuntimeError("can't start new thread")

    view = types.SimpleNamespace(Thread=Refused)
    monkeypatch.setattr("django_redislock.engine.threads.threading", view)
    return refused


def wait_idle(dog: Watchdog | None = None) -> None:
    """Wait for ``dog``'s scheduler thread (the process's watchdog by default)
    to exit, with ``IDLE_EXIT`` already made short by the caller: one waiting
    for a renewal due later is woken to read it anew."""
    from django_redislock.holds.watchdog import watchdog

    dog = watchdog if dog is None else dog
    with dog._cond:
        dog._cond.notify_all()
    thread = dog._thread
    if thread is not None:
        thread.join(10)


def no_watchdog_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's thread gone idle, and none that can start (nor a lane's)."""
    from django_redislock.holds import lanes as lanes_module
    from django_redislock.holds import watchdog as watchdog_module

    monkeypatch.setattr("django_redislock.holds.watchdog.IDLE_EXIT", 0.1)
    wait_idle()
    assert watchdog_module.watchdog._thread is None
    refuse_threads(monkeypatch, watchdog_module, lanes_module)
