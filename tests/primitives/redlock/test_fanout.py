"""``fanout.Servers``: one call per server at once, from a bounded pool of threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from django_redislock.primitives.redlock import fanout
from tests.support.scaleout import wait_until


class Echo:
    """A stand-in for a ``Script``: answers with its client after ``delay`` s."""

    name = "echo"

    def __init__(self, delay: float = 0.0, stalled: object = None) -> None:
        self.delay = delay
        self.stalled = stalled
        self.release = threading.Event()

    def __call__(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if client is self.stalled:
            self.release.wait(10)
        time.sleep(self.delay)
        if client == "refusing":
            raise redis.ConnectionError("refused")
        return (client, *args)


def test_one_result_per_server_in_order_with_its_exception() -> None:
    servers = fanout.Servers(["a", "refusing", "c"])
    results = servers.run(Echo(), [], [1], timeout=1.0)
    assert results[0] == ("a", 1)
    assert isinstance(results[1], redis.ConnectionError)
    assert results[2] == ("c", 1)
    assert servers.run(Echo(), [], [2], timeout=1.0, only=[2]) == [None, None, ("c", 2)]


def test_the_servers_are_called_at_once() -> None:
    servers = fanout.Servers(["a", "b", "c", "d", "e"])
    started = time.monotonic()
    assert len(servers.run(Echo(delay=0.5), [], [], timeout=5.0)) == 5
    assert time.monotonic() - started < 2.0  # not 5 x 0.5 s


def test_a_stalled_server_times_out_alone() -> None:
    script = Echo(stalled="b")
    servers = fanout.Servers(["a", "b", "c"])
    try:
        started = time.monotonic()
        results = servers.run(script, [], [], timeout=2.0)
        assert time.monotonic() - started < 5.0
        assert isinstance(results[1], redis.TimeoutError)
        assert results[0] == ("a",) and results[2] == ("c",)
        # the stalled worker is still busy: other workers serve the next call
        assert servers.run(Echo(), [], [], timeout=1.0, only=[0, 2])[::2] == [("a",), ("c",)]
    finally:
        script.release.set()


def test_many_callers_at_once_all_get_their_own_answers() -> None:
    servers = fanout.Servers(["a", "b", "c"])
    failures: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(50):
                assert servers.run(Echo(), [], [n, i], timeout=5.0) == [
                    (c, n, i) for c in ("a", "b", "c")
                ]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures


def test_other_exceptions_reach_the_caller() -> None:
    def broken(client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        raise TypeError("a bug, not a Redis failure")

    with pytest.raises(TypeError, match="a bug"):
        fanout.Servers(["a", "b", "c"]).run(broken, [], [], timeout=1.0)  # type: ignore[arg-type]


def test_an_idle_worker_keeps_nothing_of_its_last_job_alive() -> None:
    """A worker idles up to ``IDLE_EXIT`` between jobs: keeping its last job
    would keep what the job reached (a Redlock's holding, through the traceback
    of an error it raised) alive that long, and renewed."""
    import weakref

    class Args(list[int]):
        pass

    args = Args([1])
    freed = threading.Event()
    ref = weakref.ref(args, lambda _: freed.set())
    servers = fanout.Servers(["a"])
    assert servers.run(Echo(), [], args, timeout=1.0) == [("a", 1)]
    del args
    assert freed.wait(5), "an idle worker keeps its last job alive"
    assert ref() is None


def test_a_hung_server_holds_only_its_own_workers() -> None:
    """A hung minority server must not keep the calls to the others from being
    sent: it holds its own workers (all of them, stuck for the socket timeout),
    never the other servers'; then its calls fail at once."""
    script = Echo(stalled="b")
    servers = fanout.Servers(["a", "b", "c"])
    try:
        # more calls to the hung server than all three servers have workers
        def call_the_hung_one() -> None:
            servers.run(script, [], [], timeout=0.5, only=[1])

        occupy = [
            threading.Thread(target=call_the_hung_one) for _ in range(3 * fanout.WORKERS_PER_SERVER)
        ]
        for thread in occupy:
            thread.start()
        for thread in occupy:
            thread.join(10)
        started = time.monotonic()
        results = servers.run(script, [], [], timeout=1.0)
        assert results[0] == ("a",) and results[2] == ("c",)
        assert isinstance(results[1], redis.TimeoutError) and "hung" in str(results[1])
        assert time.monotonic() - started < 0.9  # not sent: no wait for its deadline
    finally:
        script.release.set()
    wait_until(
        lambda: servers.run(Echo(), [], [], timeout=5.0, only=[1])[1] == ("b",),
        "the hung server's workers to come back",
    )


def test_a_busy_healthy_server_is_never_refused() -> None:
    """Many calls queued on a slow server that answers: queued, not failed."""
    servers = fanout.Servers(["a", "b", "c"])
    results: list[list[Any]] = []

    def caller() -> None:
        results.append(servers.run(Echo(delay=0.02), [], [], timeout=5.0))

    callers = [threading.Thread(target=caller) for _ in range(5 * fanout.WORKERS_PER_SERVER)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(30)
    assert results == [[("a",), ("b",), ("c",)]] * len(callers)


class Extend(Echo):
    """A stand-in for the extend script: answers 1 (extended), and records
    which servers were sent the call."""

    def __init__(self, stalled: object = None, refusing: Sequence[object] = ()) -> None:
        super().__init__(stalled=stalled)
        self.refusing = refusing
        self.sent: list[object] = []

    def __call__(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        self.sent.append(client)
        if client is self.stalled:
            self.release.wait(10)
        return 0 if client in self.refusing else 1


def test_a_call_with_enough_returns_at_its_majority_and_still_tells_the_rest() -> None:
    """A renewal with its majority does not wait out a server that hangs
    (its reply timeout, for every renewal in turn); that server is still sent
    the call."""
    script = Extend(stalled="b")
    servers = fanout.Servers(["a", "b", "c"])
    try:
        started = time.monotonic()
        results = servers.run(script, [], [], timeout=3.0, enough=2)
        assert time.monotonic() - started < 1.5  # not the 3 s reply timeout
        assert results == [1, None, 1]
        wait_until(lambda: "b" in script.sent, "the hung server to be sent the call too")
    finally:
        script.release.set()


def test_a_call_short_of_enough_waits_for_every_server_as_before() -> None:
    script = Extend(stalled="c", refusing=["b"])
    servers = fanout.Servers(["a", "b", "c"])
    try:
        started = time.monotonic()
        results = servers.run(script, [], [], timeout=0.5, enough=2)
        assert time.monotonic() - started >= 0.45  # waited for the third answer
        assert results[:2] == [1, 0] and isinstance(results[2], redis.TimeoutError)
    finally:
        script.release.set()


def test_a_call_queued_past_its_deadline_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller with enough answers does not abandon its other calls: they are
    still sent, but only until their reply deadline. A call to a hung server
    that waited longer in its queue was sent once the server came back, an
    extend arriving there after the lock's release."""
    monkeypatch.setattr("django_redislock.primitives.redlock.fanout.WORKERS_PER_SERVER", 1)
    script = Extend(stalled="b")
    servers = fanout.Servers(["a", "b", "c"])
    try:
        assert servers.run(script, [], [], timeout=0.3, enough=2) == [1, None, 1]
        wait_until(lambda: "b" in script.sent, "the first call to reach the hung server")
        # b's one worker is stuck: this call waits in b's queue past its deadline
        assert servers.run(script, [], [], timeout=0.3, enough=2) == [1, None, 1]
        time.sleep(0.5)  # the subject is the queued call's deadline passing
    finally:
        script.release.set()
    wait_until(lambda: servers.run(Echo(), [], [], timeout=5.0, only=[1])[1] == ("b",),
               "b's worker to come back")  # fmt: skip
    assert script.sent.count("b") == 1
