"""``manage.py lead NAME -- COMMAND``: real runners, real commands, a real redis-server.

Each test starts ``manage.py lead`` runners as OS processes against a
``redis-server`` of its own (the leadership's), with ``tests/support/lead_child.py``
as COMMAND: it writes through a fence kept on the session's server (so
breaking the leadership's server does not reset it) and records its start
and stop. Then it breaks the leader (SIGKILL, SIGSTOP past its lease, a Redis
restart, SIGTERM) and checks: at most one COMMAND acts at any moment (accepted
writes never go back to an older fencing token, and a stale leader's writes
are refused), and a standby's COMMAND starts within the bound of
``docs/long-holds.md`` (lease + the standby's re-check + its start-up).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support import lead_child
from tests.support.servers import RedisServer

pytestmark = [
    pytest.mark.usefixtures("real_redis"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PDEATHSIG"),
]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0
#: What the bound adds to the lease: the standby's re-check (a round trip, or
#: its wait chunk, at most 3 s, if a wake-up went missing) and a COMMAND's
#: start-up (a Python interpreter, on a busy test machine): generous.
MARGIN = 8.0


def _alive(pid: int) -> bool:
    return lead_child._alive(pid)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


class Rig:
    """The runners of one test, their leadership server and the store."""

    def __init__(self, server: RedisServer, store: redis.Redis, store_url: str, tmp: Path) -> None:
        self.server, self.store, self.store_url, self.tmp = server, store, store_url, tmp
        self.runners: list[subprocess.Popen[bytes]] = []

    def start(self, *, timeout: float = LEASE, grace: float = 2.0, **env: str) -> Any:
        with open(self.tmp / f"runner-{len(self.runners)}.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "django", "lead", "beat",
                    "--timeout", str(timeout), "--grace", str(grace),
                    "--", sys.executable, "-m", "tests.support.lead_child",
                ],
                cwd=ROOT,
                env={
                    **os.environ,
                    "DJANGO_SETTINGS_MODULE": "tests.settings",
                    "REDISLOCK_TEST_REDIS_URL": self.server.url,
                    "LEAD_STORE_URL": self.store_url,
                    **env,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.runners.append(proc)
        return proc

    def next(self, event: str, timeout: float = 60) -> dict[str, Any]:
        got = self.store.blpop([f"{lead_child.BOX}{event}"], timeout=timeout)
        if got is None:
            logs = "\n".join(p.read_text() for p in sorted(self.tmp.glob("runner-*.log")))
            raise AssertionError(f"no {event!r} event within {timeout}s; runners said:\n{logs}")
        return dict(json.loads(got[1]))

    def none_within(self, event: str, seconds: float) -> None:
        assert self.store.blpop([f"{lead_child.BOX}{event}"], timeout=seconds) is None

    def runner_of(self, child: dict[str, Any]) -> subprocess.Popen[bytes]:
        parent = parent_of(child["pid"])
        [runner] = [r for r in self.runners if r.pid == parent]
        return runner

    def accepted(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.store.lrange(lead_child.ACCEPTED, 0, -1)]

    def refused(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.store.lrange(lead_child.REFUSED, 0, -1)]

    def assert_one_actor_at_a_time(self) -> None:
        """Accepted writes never go back to an older term: once a newer
        leader wrote, no older one's write got through."""
        tokens = [w["token"] for w in self.accepted()]
        assert tokens, "nobody wrote"
        assert tokens == sorted(tokens)
        by_token: dict[int, set[int]] = {}
        for w in self.accepted():
            by_token.setdefault(w["token"], set()).add(w["pid"])
        assert all(len(pids) == 1 for pids in by_token.values())

    def stop_all(self) -> None:
        for runner in self.runners:
            if runner.poll() is None:
                os.kill(runner.pid, signal.SIGCONT)
                runner.terminate()
        for runner in self.runners:
            try:
                runner.wait(30)
            except subprocess.TimeoutExpired:
                runner.kill()
                runner.wait(10)


@pytest.fixture
def rig(
    redis_server_factory: Callable[..., RedisServer], redis_url: str, tmp_path: Path
) -> Iterator[Rig]:
    store = redis.Redis.from_url(redis_url, socket_timeout=None)  # BLPOPs of a minute
    running = Rig(redis_server_factory(), store, redis_url, tmp_path)
    yield running
    running.stop_all()
    for pid in (int(p) for p in store.lrange(lead_child.PIDS, 0, -1)):
        assert not _alive(pid), f"COMMAND {pid} outlived its runner"


def test_a_sigkilled_leader_is_replaced_within_the_bound(rig: Rig) -> None:
    for _ in range(3):
        rig.start()
    first = rig.next("start")
    rig.none_within("start", 1.0)  # the others stand by
    killed_at = time.time()
    rig.runner_of(first).kill()
    second = rig.next("start", timeout=LEASE + MARGIN + 30)
    assert second["t"] - killed_at <= LEASE + MARGIN
    assert second["token"] > first["token"]
    assert second["alive"] == []  # the killed runner's COMMAND died with it
    rig.assert_one_actor_at_a_time()
    assert rig.refused() == []


def test_a_leader_paused_past_its_lease_is_replaced_and_fenced_when_it_resumes(rig: Rig) -> None:
    rig.start()
    rig.start()
    first = rig.next("start")
    runner = rig.runner_of(first)
    os.kill(first["pid"], signal.SIGSTOP)  # the whole pod pauses: runner and COMMAND
    os.kill(runner.pid, signal.SIGSTOP)
    paused_at = time.time()
    second = rig.next("start", timeout=LEASE + MARGIN + 30)
    assert second["t"] - paused_at <= LEASE + MARGIN
    assert second["token"] > first["token"]
    os.kill(first["pid"], signal.SIGCONT)  # the COMMAND resumes first, and writes
    refused = json.loads(rig.store.blpop([f"{lead_child.BOX}refused"], timeout=30)[1])
    assert refused["token"] == first["token"]
    os.kill(runner.pid, signal.SIGCONT)  # its runner learns the lease is lost, stops it
    stopped = rig.next("stop", timeout=LEASE + MARGIN + 30)
    assert stopped["pid"] == first["pid"]
    rig.assert_one_actor_at_a_time()
    assert {w["token"] for w in rig.refused()} == {first["token"]}
    assert runner.poll() is None  # the old leader stands by again, it did not crash
    rig.none_within("start", 1.0)


def test_after_a_redis_restart_one_leader_remains(rig: Rig) -> None:
    rig.start()
    rig.start()
    first = rig.next("start")
    rig.server.restart()  # the lease, queue and fence of the leadership are gone
    second = rig.next("start", timeout=LEASE + MARGIN + 30)
    assert second["token"] > first["token"]
    # the old COMMAND is stopped by its runner's next renewal (a third of the lease)
    if second["pid"] != first["pid"]:
        assert rig.next("stop", timeout=LEASE + MARGIN + 30)["pid"] == first["pid"]
    rig.none_within("start", LEASE * 2)  # settled: nobody else is elected
    alive = [p for p in (int(p) for p in rig.store.lrange(lead_child.PIDS, 0, -1)) if _alive(p)]
    assert alive == [second["pid"]]
    rig.assert_one_actor_at_a_time()


def test_a_sigterm_to_the_leader_hands_over_well_before_the_lease(rig: Rig) -> None:
    lease = 30.0
    rig.start(timeout=lease)
    rig.start(timeout=lease)
    first = rig.next("start")
    runner = rig.runner_of(first)
    termed_at = time.time()
    runner.terminate()
    assert rig.next("stop")["pid"] == first["pid"]
    second = rig.next("start", timeout=lease)
    assert second["t"] - termed_at < 5.0  # a resign: no wait for the 30 s lease
    assert runner.wait(30) == 0
    rig.assert_one_actor_at_a_time()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_standby_stopped_by_a_signal_leaves_the_queue_and_exits_0(
    rig: Rig, signum: signal.Signals
) -> None:
    rig.start()
    first = rig.next("start")
    standby = rig.start()
    queue = "redislock:{leader:beat}:queue"
    with rig.server.client() as leadership_redis:
        deadline = time.monotonic() + 60
        while not leadership_redis.zcard(queue):  # the standby has queued
            assert time.monotonic() < deadline, "the standby never queued"
            time.sleep(0.05)
        standby.send_signal(signum)
        assert standby.wait(30) == 0
        assert leadership_redis.zcard(queue) == 0  # it left the line: nothing to hand to it
    assert rig.runner_of(first).poll() is None  # the leader leads on


def test_a_runner_started_while_redis_is_down_waits_for_it_then_leads(rig: Rig) -> None:
    rig.server.kill()
    runner = rig.start()
    log = rig.tmp / "runner-0.log"
    deadline = time.monotonic() + 60
    while "cannot campaign" not in log.read_text():  # it says so, and goes on
        assert time.monotonic() < deadline, log.read_text()
        assert runner.poll() is None, log.read_text()
        time.sleep(0.05)
    rig.server.start()
    assert rig.next("start")["token"]
    assert "Traceback" not in log.read_text()


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(rig: Rig) -> None:
    runner = rig.start(grace=1.0, LEAD_CHILD_IGNORE_TERM="1")
    child = rig.next("start")
    runner.terminate()
    assert runner.wait(30) == 0
    assert not _alive(child["pid"])


def test_the_command_exit_ends_the_runner_with_its_status(rig: Rig) -> None:
    runner = rig.start(LEAD_CHILD_WRITES="3", LEAD_CHILD_EXIT="3")
    rig.next("exit")
    assert runner.wait(30) == 3
    assert "exited with status 3; resigned" in (rig.tmp / "runner-0.log").read_text()
    assert rig.server.client().exists("redislock:{leader:beat}:lock") == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["beat"], "Give the command to run after --"),
        (["beat", "--timeout", "0", "--", "true"], "--timeout must be positive"),
        (["beat", "--grace", "-1", "--", "true"], "--grace must be non-negative"),
        (["beat", "--", "no-such-program-here"], "no such program"),
        (["beat", "--using", "nope", "--", "true"], "is not a cache alias"),
    ],
)
def test_bad_arguments_are_one_line_command_errors(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as info:
        call_command("lead", *argv)
    assert "\n" not in str(info.value)
