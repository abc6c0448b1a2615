"""Real OS processes for concurrency tests.

Workers are started with the ``spawn`` method: a fresh interpreter that sets up
Django from ``tests.settings`` (whose Redis URL and database come from the
environment the parent prepared), so no lock, thread or connection state leaks
from the parent, and nothing depends on fork() in a threaded process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

CTX = multiprocessing.get_context("spawn")


def setup_worker(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings

    test_db = env.get("REDISLOCK_TEST_DB_NAME")
    if test_db:
        settings.DATABASES["default"]["NAME"] = test_db


def _entry(env: dict[str, str], target: Callable[..., Any], args: Sequence[Any]) -> None:
    setup_worker(env)
    target(*args)


def worker_env() -> dict[str, str]:
    """What a spawned worker needs to reach this test's Redis and database."""
    env = {
        key: os.environ[key]
        for key in ("REDISLOCK_TEST_REDIS_URL", "DATABASE_URL", "REDISLOCK_TEST_SQLITE_DIR")
        if key in os.environ
    }
    try:
        from django.db import connection

        env["REDISLOCK_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    except Exception:
        pass
    return env


@contextmanager
def processes(
    target: Callable[..., Any], args_list: Sequence[Sequence[Any]], *, timeout: float = 120
) -> Iterator[list[multiprocessing.process.BaseProcess]]:
    """Run ``target(*args)`` in one process per args; all are reaped on exit.

    Closes the parent's database connections first, so children never share a
    socket with it.
    """
    from django.db import connections

    connections.close_all()
    env = worker_env()
    procs = [CTX.Process(target=_entry, args=(env, target, tuple(a))) for a in args_list]
    for proc in procs:
        proc.start()
    try:
        yield procs
        for proc in procs:
            proc.join(timeout)
        stuck = [p.pid for p in procs if p.is_alive()]
        assert not stuck, f"worker processes {stuck} did not finish within {timeout}s"
        failed = [(p.pid, p.exitcode) for p in procs if p.exitcode != 0]
        assert not failed, f"worker processes failed (pid, exit code): {failed}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def start_one(target: Callable[..., Any], *args: Any) -> multiprocessing.process.BaseProcess:
    """One worker process, for tests that start workers one at a time."""
    from django.db import connections

    connections.close_all()
    proc = CTX.Process(target=_entry, args=(worker_env(), target, args))
    proc.start()
    return proc


def reap(started: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Kill what is still running of ``started``."""
    for proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@contextmanager
def queued_in_turn(
    client: Any, queue_key: str, target: Callable[..., Any], args_list: Sequence[Sequence[Any]]
) -> Iterator[list[multiprocessing.process.BaseProcess]]:
    """Start one worker per args, each once the one before it is queued (the
    ZSET ``queue_key`` has grown by one), so their arrival order is the list's.
    The block lets them in (releases what they wait for); on exit they must
    all have finished cleanly."""
    started: list[multiprocessing.process.BaseProcess] = []
    try:
        for index, args in enumerate(args_list):
            started.append(start_one(target, *args))
            deadline = time.monotonic() + 30
            while client.zcard(queue_key) < index + 1:
                assert time.monotonic() < deadline, f"worker {index} never queued"
                time.sleep(0.01)  # polling Redis: no event tells a queue grew
        yield started
        for proc in started:
            proc.join(60)
            assert proc.exitcode == 0, f"worker {proc.pid} exited with {proc.exitcode}"
    finally:
        reap(started)
