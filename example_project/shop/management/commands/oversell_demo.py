"""Show a naive read-modify-write overselling, and ``deduct()`` not, with real processes."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from multiprocessing.connection import wait
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from example_project.shop.demo import ATTEMPTS_KEY, TIMEOUTS_KEY, run_worker
from example_project.shop.models import SKU, Order

DEMO_CODE = "oversell-demo"
MODES = {"naive": "naive read-modify-write", "deduct": "deduct()"}
#: Each option's range: a worker is a process with Django set up; stock and
#: attempts bound the run (deduct() buys one at a time), think-ms a sleep.
LIMITS = {"workers": (1, 32), "stock": (1, 1_000_000), "attempts": (1, 1000), "think_ms": (0, 2000)}
#: How long the workers may take to exit once the run is over.
EXIT_SECONDS = 60
#: How long they may take to start (each sets Django up; 32 on two cores take a while).
START_SECONDS = 120


@dataclass
class Result:
    stock: int
    sold: int
    left: int
    seconds: float
    timeouts: int

    @property
    def oversold(self) -> int:
        return max(0, self.sold - self.stock)

    @property
    def rate(self) -> float:
        return self.sold / self.seconds if self.seconds else 0.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server every worker process can reach, for as long as the demo runs."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise CommandError(
            "oversell_demo needs a Redis that several processes share: the embedded "
            "fakeredis server lives inside one process. Install redis-server "
            "(apt-get install redis-server) or set REDIS_URL=redis://..."
        )
    import redis

    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="oversell-demo-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise CommandError(f"redis-server did not start on port {port}.") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


class Command(BaseCommand):
    help = (
        "Run N worker processes buying one SKU, first with a naive read-modify-write, "
        "then with InventoryMixin.deduct(), and compare sold / oversold / orders per second."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=8, help="Worker processes (1-32).")
        parser.add_argument(
            "--stock", type=int, default=100, help="Initial stock of the SKU (1-1000000)."
        )
        parser.add_argument(
            "--attempts", type=int, default=40, help="Purchase attempts per worker (1-1000)."
        )
        parser.add_argument(
            "--think-ms",
            type=float,
            default=2.0,
            help="Time a purchase spends between reading and writing (a payment call), 0-2000.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name, (low, high) in LIMITS.items():
            # written so that nan fails it too
            if not low <= options[name] <= high:
                raise CommandError(
                    f"--{name.replace('_', '-')} must be between {low} and {high}, "
                    f"not {options[name]}."
                )
        workers, stock, attempts = options["workers"], options["stock"], options["attempts"]
        think_ms = options["think_ms"]

        with contextlib.ExitStack() as stack:
            url = os.environ.get("REDIS_URL")
            if url:
                self.stdout.write(f"Using Redis at {url}.")
            else:
                url = stack.enter_context(private_redis())
                os.environ["REDIS_URL"] = url  # inherited by the worker processes
                self.stdout.write(f"Started a private redis-server at {url} for the workers.")
            self.stdout.write(
                f"{workers} processes x {attempts} attempts on a stock of {stock} "
                f"({think_ms:g} ms between read and write).\n"
            )
            results = {
                mode: self._run(mode, url, workers, stock, attempts, think_ms) for mode in MODES
            }
        self._report(results)

    def _run(
        self, mode: str, url: str, workers: int, stock: int, attempts: int, think_ms: float
    ) -> Result:
        import redis
        from django.db import connections

        sku, _ = SKU.objects.update_or_create(
            code=DEMO_CODE,
            defaults={"title": "Oversell demo", "price": Decimal("1.00"), "stock": stock},
        )
        Order.objects.filter(sku=sku).delete()
        counter = redis.Redis.from_url(url)
        counter.delete(ATTEMPTS_KEY, TIMEOUTS_KEY)
        connections.close_all()

        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(workers + 1)
        procs = [
            ctx.Process(target=run_worker, args=(mode, sku.pk, attempts, think_ms, barrier))
            for _ in range(workers)
        ]
        for proc in procs:
            proc.start()
        try:
            self._start_together(mode, procs, barrier)
            started = time.monotonic()
            total = workers * attempts
            done = 0
            self._shown: int | None = None
            while done < total and any(proc.is_alive() for proc in procs):
                self._progress(MODES[mode], done, total)
                time.sleep(0.1)  # a display refresh, not synchronisation
                done = int(counter.get(ATTEMPTS_KEY) or 0)
            seconds = time.monotonic() - started
            self._progress(MODES[mode], done, total, final=True)
        finally:
            # Many workers on few cores take seconds to exit (each tears down
            # Django): killed sooner, they were reported as failed, with no error.
            deadline = time.monotonic() + EXIT_SECONDS
            for proc in procs:
                proc.join(max(0.0, deadline - time.monotonic()))
            stuck = [proc for proc in procs if proc.is_alive()]
            for proc in stuck:
                proc.kill()
                proc.join()
        if stuck:
            raise CommandError(
                f"{len(stuck)} {mode} worker(s) had not exited {EXIT_SECONDS} s after the "
                "run; stopped them."
            )
        failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
        if failed:
            raise CommandError(f"{len(failed)} {mode} worker(s) failed; see the errors above.")
        sku.refresh_from_db()
        return Result(
            stock=stock,
            sold=Order.objects.filter(sku=sku).count(),
            left=sku.stock,
            seconds=seconds,
            timeouts=int(counter.get(TIMEOUTS_KEY) or 0),
        )

    def _start_together(self, mode: str, procs: list[Any], barrier: Any) -> None:
        """Release the workers at once when all are ready. One that dies on its
        way (an import error, a database it cannot reach) ends the run as soon
        as it exits, with a one-line error, not after ``START_SECONDS`` with a
        ``BrokenBarrierError``: a watcher aborts the barrier. A worker that
        exits 0 got past the barrier (it may be done already): no abort."""
        done_r, done_w = multiprocessing.Pipe(duplex=False)
        died = threading.Event()

        def watch() -> None:
            waiting = {proc.sentinel: proc for proc in procs}
            while waiting:
                ready = wait([done_r, *waiting])
                if done_r in ready:
                    return
                for sentinel in ready:
                    proc = waiting.pop(sentinel)
                    proc.join()
                    if proc.exitcode:
                        died.set()
                        barrier.abort()
                        return

        watcher = threading.Thread(target=watch, name="oversell-demo-start", daemon=True)
        watcher.start()
        try:
            barrier.wait(timeout=START_SECONDS)
            return
        except threading.BrokenBarrierError:
            pass
        finally:
            done_w.send(None)
            watcher.join()
        if not died.is_set():
            raise CommandError(f"The {mode} workers were not ready within {START_SECONDS} s.")
        deadline = time.monotonic() + EXIT_SECONDS  # the others, let go by the abort, exit
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        codes = sorted({proc.exitcode for proc in procs if proc.exitcode})
        dead = sum(1 for proc in procs if proc.exitcode)
        raise CommandError(
            f"{dead} {mode} worker(s) exited before the run started "
            f"(exit code {', '.join(map(str, codes))}); see the errors above."
        )

    def _progress(self, label: str, done: int, total: int, *, final: bool = False) -> None:
        """The bar, redrawn in place on a terminal. Elsewhere (a pipe, a log, CI)
        carriage returns piled every redraw onto one line: there, a line of its
        own at the start, each tenth of the way, and the end."""
        width = 30
        filled = width * done // total if total else width
        bar = "#" * filled + "-" * (width - filled)
        line = f"  {label:<24} [{bar}] {done}/{total}"
        if self.stdout.isatty():
            self.stdout.write("\r" + line, ending="\n" if final else "")
            self.stdout.flush()
            return
        shown = getattr(self, "_shown", None)
        step = max(1, total // 10)
        if shown is None or done >= shown + step or (final and done != shown):
            self.stdout.write(line)
            self.stdout.flush()
            self._shown = done

    def _report(self, results: dict[str, Result]) -> None:
        naive, ours = results["naive"], results["deduct"]
        rows = [
            ("initial stock", naive.stock, ours.stock),
            ("sold (orders)", naive.sold, ours.sold),
            ("oversold", naive.oversold, ours.oversold),
            ("stock left", naive.left, ours.left),
            ("lock timeouts", "-", ours.timeouts),
            ("orders/s", f"{naive.rate:.0f}", f"{ours.rate:.0f}"),
        ]
        left_width = max(len(MODES["naive"]), 10)
        self.stdout.write("")
        self.stdout.write(f"{'':<16}{MODES['naive']:>{left_width + 2}}{MODES['deduct']:>12}")
        for label, a, b in rows:
            self.stdout.write(f"{label:<16}{a!s:>{left_width + 2}}{b!s:>12}")
        self.stdout.write("")
        if naive.oversold:
            self.stdout.write(
                self.style.ERROR(
                    f"naive: sold {naive.sold} of {naive.stock}, oversold by {naive.oversold} "
                    "(lost updates: two workers read the same stock and both wrote it back)."
                )
            )
        else:
            self.stdout.write("naive: no oversell this time (try more --workers or --think-ms).")
        style = self.style.SUCCESS if not ours.oversold else self.style.ERROR
        self.stdout.write(
            style(f"deduct(): sold {ours.sold} of {ours.stock}, oversold by {ours.oversold}.")
        )
        if self.stdout.isatty():
            self.stdout.write("")
