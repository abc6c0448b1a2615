"""Worker processes: take a primitive, read-modify-write a register, release; log it all.

A worker is a spawned interpreter set up like the suite's other workers
(``tests/support/procs.py``), with caches that reach Redis only through the
nemesis's fault proxies and a 0.5 s socket timeout. It loops over the
operations its seed gives it (``schedule.next_op``) until the runner sets its
stop flag. Each operation logs, ``fsync``'d, before and after every step that
matters to the checker::

    start  op, kind, res (its resources), mode, bt, lease, renew
    acq    ok (or err: what the acquire raised)
    token  res, token
    read   res, value               write  res, token, value, outcome
    rel    (the holder starts releasing)
    end    outcome: ok | lost | backend | notowned | timeout | error, err

and the ``lock_lost`` signal logs ``lost`` with the name and how long it was
held, whichever thread sends it. The operation kinds are in ``operations``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.faults.nemesis.journal import Journal
from tests.faults.nemesis.schedule import OpPlan, next_op, worker_rng


@dataclass(frozen=True)
class WorkerArgs:
    """Everything a worker process needs (picklable, for ``spawn``)."""

    env: dict[str, str]
    worker: int
    seed: int
    log_dir: str
    caches: dict[str, Any]
    redislock: dict[str, Any]
    naive_url: str
    sabotage: bool


def main(args: WorkerArgs, stop: Any, holding: Any) -> None:
    """The process target: ``stop`` and ``holding`` are shared bytes (no lock: a
    SIGKILLed worker must not leave one taken)."""
    from tests.support.procs import setup_worker

    setup_worker(args.env)
    from django.conf import settings

    settings.CACHES = args.caches  # before any cache is opened
    log_file = Path(args.log_dir) / f"worker-{args.worker:03d}.txt"
    logging.basicConfig(filename=log_file, level=logging.WARNING, force=True)
    settings.REDISLOCK = args.redislock
    Worker(args, stop, holding).run()


def classify(exc: BaseException) -> str:
    from django_redislock import LockBackendError, LockLostError, LockNotOwnedError, LockTimeout

    for cls, outcome in (
        (LockLostError, "lost"),
        (LockBackendError, "backend"),
        (LockNotOwnedError, "notowned"),
        (LockTimeout, "timeout"),
    ):
        if isinstance(exc, cls):
            return outcome
    return "error"


class Worker:
    def __init__(self, args: WorkerArgs, stop: Any, holding: Any) -> None:
        from django_redislock.signals import lock_lost

        self.args = args
        self.stop = stop
        self.holding = holding
        self.log = Journal(Path(args.log_dir) / f"worker-{args.worker:03d}.log")
        self.rng = worker_rng(args.seed, args.worker)
        self.loop = asyncio.new_event_loop()
        lock_lost.connect(self._on_lost, weak=False)

    def _on_lost(self, sender: object, name: str, held: float = 0.0, **kwargs: Any) -> None:
        self.log.write("lost", name=name, held=held, reason=str(kwargs.get("reason")))

    def run(self) -> None:
        from tests.faults.nemesis.operations import OPERATIONS

        self.log.write("hello", w=self.args.worker, pid=os.getpid())
        count = 0
        while not self.stop.value:
            count += 1
            plan = next_op(self.rng, sabotage=self.args.sabotage)
            OPERATIONS[plan.kind](Op(self, f"{self.args.worker}.{count}", plan))
        self.log.write("bye")


class Op:
    """One operation of a worker: its log lines and its register accesses."""

    def __init__(self, worker: Worker, op_id: str, plan: OpPlan) -> None:
        self.worker = worker
        self.id = op_id
        self.plan = plan

    def log(self, ev: str, **fields: Any) -> None:
        self.worker.log.write(ev, op=self.id, **fields)

    def begin(self, resources: tuple[str, ...], mode: str = "w", bt: float | None = None) -> None:
        plan = self.plan
        bt = plan.blocking_timeout if bt is None else bt
        self.log(
            "start",
            kind=plan.kind,
            res=list(resources),
            mode=mode,
            bt=bt,
            lease=plan.lease,
            renew=plan.auto_renew,
        )

    def acquired(self, ok: bool) -> None:
        self.log("acq", ok=ok)
        self.worker.holding.value = int(ok)

    def work(self, step: int) -> None:
        time.sleep(self.plan.work[step])

    def read(self, res: str) -> int:
        from tests.models import NemesisRegister

        value = NemesisRegister.objects.values_list("value", flat=True).get(name=res)
        self.log("read", res=res, value=value)
        return value

    def rmw(self, res: str, token: int | None) -> None:
        """Read, work, write ``value + 1``: fenced and guarded on the value read
        (docs/faults.md's read-modify-write recipe), or, with no token (the
        sabotage mode's naive lock), as a naive program would."""
        from django.db import DatabaseError, connections, transaction

        from django_redislock.fencing import fenced_update
        from tests.models import NemesisRegister, NemesisWrite

        try:
            read = self.read(res)
            self.work(1)
            rows = NemesisRegister.objects.filter(name=res)
            with transaction.atomic():
                if token is None:
                    written = bool(rows.update(value=read + 1))
                else:
                    written = fenced_update(rows.filter(value=read), token, value=read + 1)
                if written:
                    NemesisWrite.objects.create(
                        register=res, value=read + 1, token=token, op=self.id
                    )
            outcome = "ok"
            if not written:
                fence = rows.values_list("fence", flat=True).get()
                outcome = (
                    "refused-fence" if token is not None and fence >= token else "refused-value"
                )
        except DatabaseError as exc:
            connections.close_all()
            self.log("write", res=res, token=token, value=None, outcome="db-error", err=repr(exc))
            return
        self.log("write", res=res, token=token, value=read + 1, outcome=outcome)

    def peek(self, res: str) -> None:
        """A reader's read (its database errors logged, as a write's are)."""
        from django.db import DatabaseError, connections

        try:
            self.read(res)
        except DatabaseError as exc:
            connections.close_all()
            self.log("read", res=res, value=None, err=repr(exc))

    async def armw(self, res: str, token: int | None) -> None:
        from asgiref.sync import sync_to_async

        await sync_to_async(self.rmw)(res, token)

    def hold(
        self,
        acquire: Callable[[], bool],
        body: Callable[[], None],
        release: Callable[[], None],
    ) -> None:
        """Acquire, run ``body``, release (also after ``body`` raised a ``LockError``),
        and log the outcome: the first error the holder was given decides it,
        but a ``LockLostError`` from any step makes it ``lost``."""
        from django_redislock import LockError

        try:
            ok = acquire()
        except LockError as exc:
            self.acquire_failed(exc)
            return
        self.acquired(ok)
        if not ok:
            self.log("end", outcome="timeout")
            return
        outcome, error = "ok", ""
        try:
            body()
        except LockError as exc:
            outcome, error = classify(exc), repr(exc)
        self.log("rel")
        try:
            release()
        except LockError as exc:
            outcome, error = self._worse(outcome, error, exc)
        self.worker.holding.value = 0
        self.log("end", outcome=outcome, err=error)

    async def ahold(
        self,
        acquire: Callable[[], Awaitable[bool]],
        body: Callable[[], Awaitable[None]],
        release: Callable[[], Awaitable[None]],
    ) -> None:
        """``hold`` for the async primitives, run on the worker's own loop."""
        from django_redislock import LockError

        try:
            ok = await acquire()
        except LockError as exc:
            self.acquire_failed(exc)
            return
        self.acquired(ok)
        if not ok:
            self.log("end", outcome="timeout")
            return
        outcome, error = "ok", ""
        try:
            await body()
        except LockError as exc:
            outcome, error = classify(exc), repr(exc)
        self.log("rel")
        try:
            await release()
        except LockError as exc:
            outcome, error = self._worse(outcome, error, exc)
        self.worker.holding.value = 0
        self.log("end", outcome=outcome, err=error)

    def run_async(self, coro: Awaitable[None]) -> None:
        self.worker.loop.run_until_complete(coro)

    def acquire_failed(self, exc: BaseException) -> None:
        self.log("acq", ok=False, err=repr(exc))
        self.log("end", outcome=classify(exc), err=repr(exc))

    @staticmethod
    def _worse(outcome: str, error: str, exc: BaseException) -> tuple[str, str]:
        if outcome == "ok" or classify(exc) == "lost":
            return classify(exc), repr(exc)
        return outcome, error
