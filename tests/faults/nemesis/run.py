"""One nemesis run: start the servers and proxies, the workers and the nemesis;
stop them; check. Needs Django set up and the test database created (pytest's
``transactional_db``, or ``__main__``'s own)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.faults.nemesis import schedule, workers
from tests.faults.nemesis.checker import Report, check
from tests.faults.nemesis.journal import Journal, now
from tests.faults.nemesis.nemesis import AOF_ARGS, Nemesis, Probe, Rig, WorkerSlot
from tests.support.faultproxy import FaultProxy
from tests.support.procs import CTX, worker_env
from tests.support.servers import RedisServer

REDLOCK_ALIASES = ["nemesis0", "nemesis1", "nemesis2"]
#: How long the workers get to finish their last operation once told to stop.
STOP_GRACE = 30.0


@dataclass(frozen=True)
class Config:
    seed: int
    seconds: float
    workers: int = 6
    sabotage: bool = False
    log_dir: Path | None = None

    def replay(self) -> str:
        sabotage = " --sabotage" if self.sabotage else ""
        return (
            f"python -m tests.faults.nemesis --seconds {self.seconds:g} --seed {self.seed} "
            f"--workers {self.workers}{sabotage}"
        )


def run(config: Config, interrupted: threading.Event | None = None) -> Report:
    """Run it; the report's ``violations`` are what went wrong (none: it passed).
    Setting ``interrupted`` ends the faults early; what ran is checked."""
    from django.db import connection

    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix=f"nemesis-{config.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    _reset_registers()
    report = Report(config.seed, config.seconds, config.workers, connection.vendor, log_dir)
    report.replay = config.replay()
    about = {**asdict(config), "log_dir": str(log_dir), "database": connection.vendor}
    (log_dir / "run.json").write_text(json.dumps(about))
    nemesis_log = Journal(log_dir / "nemesis.log")
    try:
        with _rig() as rig:
            report.seconds = _drive(config, rig, nemesis_log, log_dir, interrupted)
    finally:
        nemesis_log.close()
    history, registers = _database_record()
    record = {"history": history, "registers": registers, "seconds": report.seconds}
    (log_dir / "database.json").write_text(json.dumps(record, indent=0))
    return check(log_dir, history, registers, report)


def recheck(log_dir: Path) -> Report:
    """Check again the logs and the database record an earlier run left."""
    about = json.loads((log_dir / "run.json").read_text())
    record = json.loads((log_dir / "database.json").read_text())
    config = Config(about["seed"], about["seconds"], about["workers"], about["sabotage"])
    seconds = record.get("seconds", config.seconds)
    report = Report(config.seed, seconds, config.workers, about["database"], log_dir)
    report.replay = config.replay()
    return check(log_dir, record["history"], record["registers"], report)


def _drive(
    config: Config, rig: Rig, log: Journal, log_dir: Path, interrupted: threading.Event | None
) -> float:
    stop = CTX.Value("b", 0, lock=False)
    spawn = _spawner(config, rig, stop, log_dir)
    for _ in range(config.workers):
        spawn()
    _await_hellos(rig, log_dir)
    started = now()
    tracks = schedule.faults(config.seed, config.seconds)
    nemeses = [Nemesis(rig, track, tracks[track], log, started) for track in tracks]
    probe = Probe(rig.proxy.url, log)
    for thread in [*nemeses, probe]:
        thread.start()
    interrupted = interrupted or threading.Event()
    try:
        while now() < started + config.seconds and all(n.error is None for n in nemeses):
            if interrupted.wait(0.2):
                log.write("interrupted")
                break
            _replace_dead(rig, log, spawn)
    finally:
        elapsed = now() - started
        for thread in [*nemeses, probe]:
            thread.stop()
        stop.value = 1
        _stop_workers(rig, log)
    for nemesis in nemeses:
        if nemesis.error is not None:
            raise RuntimeError(f"the nemesis's {nemesis.track} track failed") from nemesis.error
    return elapsed


def _spawner(config: Config, rig: Rig, stop: Any, log_dir: Path) -> Any:
    base = _worker_args(config, rig, log_dir)

    def spawn() -> None:
        with rig.lock:
            worker = rig.spawned
            rig.spawned += 1
            holding = CTX.Value("b", 0, lock=False)
            args = workers.WorkerArgs(**{**base, "worker": worker})
            process = CTX.Process(target=workers.main, args=(args, stop, holding), daemon=True)
            process.start()
            rig.workers[worker] = WorkerSlot(worker, process, holding)

    return spawn


def _await_hellos(rig: Rig, log_dir: Path, timeout: float = 120.0) -> None:
    """Start the clock once every worker is set up and logging (spawning
    interpreters that set up Django takes seconds on a busy machine)."""
    deadline = now() + timeout
    paths = [log_dir / f"worker-{w:03d}.log" for w in rig.workers]
    while not all(path.exists() and path.stat().st_size for path in paths):
        if now() > deadline:
            raise RuntimeError(f"workers not started within {timeout:g} s")
        if any(slot.process.exitcode is not None for slot in rig.workers.values()):
            raise RuntimeError("a worker died while starting (see its .txt log)")
        time.sleep(0.05)


def _replace_dead(rig: Rig, log: Journal, spawn: Any) -> None:
    """A worker the nemesis killed is replaced; one that died otherwise is a crash."""
    with rig.lock:
        dead = [slot for slot in rig.workers.values() if slot.process.exitcode is not None]
        for slot in dead:
            del rig.workers[slot.worker]
    for slot in dead:
        if slot.process.exitcode != -signal.SIGKILL:
            log.write("crash", w=slot.worker, pid=slot.process.pid, code=slot.process.exitcode)
        spawn()


def _stop_workers(rig: Rig, log: Journal) -> None:
    deadline = now() + STOP_GRACE
    for slot in rig.live_workers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGCONT)  # never left stopped
    for slot in rig.live_workers():
        slot.process.join(max(0.1, deadline - now()))
        if slot.process.is_alive():
            log.write("cleanup-kill", w=slot.worker, pid=slot.process.pid)
            slot.process.kill()
            slot.process.join(10)
        elif slot.process.exitcode not in (0, -signal.SIGKILL):
            log.write("crash", w=slot.worker, pid=slot.process.pid, code=slot.process.exitcode)


def _worker_args(config: Config, rig: Rig, log_dir: Path) -> dict[str, Any]:
    from tests.settings import redis_cache

    timeouts = {
        "SOCKET_TIMEOUT": schedule.SOCKET_TIMEOUT,
        "SOCKET_CONNECT_TIMEOUT": schedule.SOCKET_TIMEOUT,
    }
    caches = {"default": redis_cache(rig.proxy.url, **timeouts)}
    for alias, proxy in zip(REDLOCK_ALIASES, rig.redlock_proxies, strict=True):
        caches[alias] = redis_cache(proxy.url, **timeouts)
    return {
        "env": worker_env(),
        "seed": config.seed,
        "log_dir": str(log_dir),
        "caches": caches,
        "redislock": {"KEY_PREFIX": "nemesis", "REDLOCK": REDLOCK_ALIASES},
        "naive_url": rig.proxy.url,
        "sabotage": config.sabotage,
    }


@contextlib.contextmanager
def _rig() -> Iterator[Rig]:
    """A main server and three Redlock servers (AOF on), each behind its own proxy."""
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(RedisServer(args=AOF_ARGS)) for _ in range(4)]
        proxies = [stack.enter_context(FaultProxy(server.url)) for server in servers]
        yield Rig(servers[0], proxies[0], servers[1:], proxies[1:])


def _reset_registers() -> None:
    from tests.models import NemesisRegister, NemesisWrite

    NemesisWrite.objects.all().delete()
    NemesisRegister.objects.all().delete()
    NemesisRegister.objects.bulk_create(NemesisRegister(name=n) for n in schedule.RESOURCES)


def _database_record() -> tuple[list[dict[str, Any]], dict[str, int]]:
    from tests.models import NemesisRegister, NemesisWrite

    history = list(NemesisWrite.objects.order_by("id").values("register", "value", "token", "op"))
    registers = dict(NemesisRegister.objects.values_list("name", "value"))
    return history, registers
