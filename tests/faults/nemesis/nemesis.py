"""The nemesis: a thread that applies the seed's faults, one at a time, and logs them.

It acts on what ``Rig`` holds: the workers (SIGSTOP, SIGKILL), the main
``redis-server`` (restarted from its AOF, paused), the fault proxies between the
workers and the servers (partition, slow, reset: the main server's three times
in four) and the three Redlock servers (paused, restarted). Each fault is
logged before it is applied and ``healed`` after it ended, so the checker's
windows contain the real ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.faults.nemesis.journal import Journal, now
from tests.faults.nemesis.schedule import Fault
from tests.support.faultproxy import FaultProxy
from tests.support.servers import RedisServer

#: Every server keeps an append-only file synced on each write: a restart loses
#: no acknowledged lease or fencing counter (the setting Redlock asks for).
AOF_ARGS = ("--appendonly", "yes", "--appendfsync", "always")


@dataclass
class WorkerSlot:
    """One running worker process and its shared ``holding`` flag."""

    worker: int
    process: Any
    holding: Any


@dataclass
class Rig:
    redis: RedisServer
    proxy: FaultProxy
    redlock: list[RedisServer]
    redlock_proxies: list[FaultProxy]
    workers: dict[int, WorkerSlot] = field(default_factory=dict)
    spawned: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live_workers(self) -> list[WorkerSlot]:
        with self.lock:
            return [slot for slot in self.workers.values() if slot.process.is_alive()]


class Nemesis(threading.Thread):
    """One track of faults (``schedule.TRACKS``); the runner starts one per track."""

    def __init__(
        self, rig: Rig, track: str, schedule: list[Fault], journal: Journal, started: float
    ) -> None:
        super().__init__(name=f"nemesis-{track}", daemon=True)
        self.track = track
        self.rig = rig
        self.schedule = schedule
        self.journal = journal
        self.started = started
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._stopped: set[int] = set()
        self._down: list[RedisServer] = []
        self._fault_id = ""

    def run(self) -> None:
        try:
            for fault in self.schedule:
                if self.stopping.wait(max(0.0, self.started + fault.at - now())):
                    return
                self.apply(fault)
        except BaseException as exc:  # the runner reports it: a broken rig is no result
            self.error = exc
            self.journal.write("nemesis-error", err=repr(exc))
        finally:
            self.heal_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)

    def apply(self, fault: Fault) -> None:
        handler: Callable[[Fault], None] = getattr(self, f"_{fault.kind}")
        self._fault_id = f"{self.track}.{fault.at}"
        handler(fault)

    def _log(self, ev: str, kind: str, **fields: Any) -> None:
        """A ``fault`` or ``healed`` line, with the id that pairs them."""
        self.journal.write(ev, kind=kind, n=self._fault_id, **fields)

    def _wait(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    # faults of the workers ---------------------------------------------------------

    def _pick_worker(self, fault: Fault) -> WorkerSlot | None:
        live = self.rig.live_workers()
        holders = [slot for slot in live if slot.holding.value]
        candidates = holders or live
        return candidates[int(fault.pick * len(candidates))] if candidates else None

    def _pause_holder(self, fault: Fault) -> None:
        slot = self._pick_worker(fault)
        if slot is None:
            return
        pid = slot.process.pid
        self._log("fault", fault.kind, pid=pid, w=slot.worker, at=fault.at)
        self._stopped.add(pid)
        os.kill(pid, signal.SIGSTOP)
        self._wait(fault.duration)
        self._resume(pid)
        self._log("healed", fault.kind, pid=pid)

    def _kill_holder(self, fault: Fault) -> None:
        slot = self._pick_worker(fault)
        if slot is None:
            return
        self._log("fault", fault.kind, pid=slot.process.pid, w=slot.worker)
        slot.process.kill()
        slot.process.join(10)
        self._log("healed", fault.kind, pid=slot.process.pid)

    def _resume(self, pid: int) -> None:
        self._stopped.discard(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    # faults of the servers ----------------------------------------------------------

    def _restart(self, fault: Fault, server: RedisServer, **info: Any) -> None:
        self._log("fault", fault.kind, port=server.port, **info)
        self._down.append(server)
        server.kill()
        self._wait(fault.duration)
        server.start()  # same port, same dir: it loads its AOF
        self._down.remove(server)
        self._log("healed", fault.kind, port=server.port)

    def _pause(self, fault: Fault, servers: list[RedisServer]) -> None:
        pids = [server.process.pid for server in servers if server.process is not None]
        self._log("fault", fault.kind, ports=[s.port for s in servers])
        for pid in pids:
            self._stopped.add(pid)
            os.kill(pid, signal.SIGSTOP)
        self._wait(fault.duration)
        for pid in pids:
            self._resume(pid)
        self._log("healed", fault.kind)

    def _restart_redis(self, fault: Fault) -> None:
        self._restart(fault, self.rig.redis)

    def _pause_redis(self, fault: Fault) -> None:
        self._pause(fault, [self.rig.redis])

    def _redlock_restart(self, fault: Fault) -> None:
        index = int(fault.pick * len(self.rig.redlock))
        self._restart(fault, self.rig.redlock[index], index=index)

    def _redlock_pause(self, fault: Fault) -> None:
        count = len(self.rig.redlock)
        first = int(fault.pick * count)
        picked = [self.rig.redlock[(first + i) % count] for i in range(int(fault.param))]
        self._pause(fault, picked)

    # faults of the network ----------------------------------------------------------

    def _proxy(self, fault: Fault) -> tuple[FaultProxy, str]:
        """The main server's proxy three times in four, else a Redlock server's."""
        if fault.pick < 0.75:
            return self.rig.proxy, "main"
        index = min(int((fault.pick - 0.75) * 4 * len(self.rig.redlock)), len(self.rig.redlock) - 1)
        return self.rig.redlock_proxies[index], f"redlock{index}"

    def _partition(self, fault: Fault) -> None:
        proxy, name = self._proxy(fault)
        self._log("fault", fault.kind, server=name)
        proxy.blackhole()
        self._wait(fault.duration)
        proxy.heal()
        self._log("healed", fault.kind)

    def _slow(self, fault: Fault) -> None:
        proxy, name = self._proxy(fault)
        self._log("fault", fault.kind, server=name, latency=fault.param)
        proxy.latency = fault.param
        self._wait(fault.duration)
        proxy.heal()
        self._log("healed", fault.kind)

    def _reset(self, fault: Fault) -> None:
        proxy, name = self._proxy(fault)
        self._log("fault", fault.kind, server=name)
        proxy.cut()
        self._log("healed", fault.kind)

    # the end -------------------------------------------------------------------------

    def heal_all(self) -> None:
        """Whatever this track was doing when stopped: undo it."""
        for pid in list(self._stopped):
            self._resume(pid)
        if self.track == "servers":
            for proxy in [self.rig.proxy, *self.rig.redlock_proxies]:
                proxy.heal()
        for server in self._down:
            if server.process is None or server.process.poll() is not None:
                server.start()
        self._down.clear()


class Probe(threading.Thread):
    """PINGs Redis through the proxy every 0.1 s and logs each PING slower
    than ``SLOW``: when no fault explains it, the machine stalled the proxy
    (it runs in the runner's process) or Redis, and an acquire that overran
    its bound meanwhile met a slow Redis, not a quiet one."""

    SLOW = 0.2

    def __init__(self, url: str, journal: Journal) -> None:
        super().__init__(name="nemesis-probe", daemon=True)
        self.url = url
        self.journal = journal
        self.stopping = threading.Event()

    def run(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        while not self.stopping.wait(0.1):
            began = now()
            with contextlib.suppress(redis.RedisError, OSError):
                client.ping()
            took = now() - began
            if took > self.SLOW:
                self.journal.write("stall", since=began, took=took)
        client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
