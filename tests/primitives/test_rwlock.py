from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import LockLostError, LockNotOwnedError, LockTimeout, ReadWriteLock
from django_redislock.ops.inspection import clear, list_held
from tests.support.gauge import Gauge
from tests.support.procs import CTX, processes

# --- workers ---------------------------------------------------------------------


def _mixed_worker(
    name: str, writer: bool, cycles: int, readers: Gauge, writers: Gauge, start: Any
) -> None:
    rw = ReadWriteLock(name, timeout=10, blocking_timeout=60)
    start.wait(60)  # all workers run at once, however slowly they were spawned
    for _ in range(cycles):
        if writer:
            with rw.write(), writers.inside() as inside:
                assert inside == 1, "two writers at once"
                assert readers.now == 0, "a writer overlapped a reader"
                time.sleep(0.002)
        else:
            with rw.read(), readers.inside():
                assert writers.now == 0, "a reader overlapped a writer"
                time.sleep(0.01)


def _reader_stream(name: str, stop: Any, readers: Gauge) -> None:
    """Hold the read side back to back, overlapping the other readers, until told to stop."""
    rw = ReadWriteLock(name, timeout=10, blocking_timeout=60)
    while not stop.is_set():
        with rw.read(), readers.inside():
            time.sleep(0.05)


# --- basics ----------------------------------------------------------------------


def test_readers_share_writer_excludes_and_keys_go_away(redis_client: redis.Redis) -> None:
    rw = ReadWriteLock("doc")
    first, second, writer = rw.read(), rw.read(), rw.write()
    assert first.acquire()
    assert second.acquire(blocking=False)
    assert not writer.acquire(blocking=False)
    first.release()
    assert not writer.acquire(blocking=False)
    second.release()
    assert writer.acquire(blocking=False)
    assert not rw.read().acquire(blocking=False)
    assert not rw.write().acquire(blocking=False)
    assert [h.mode for h in rw.holders()] == ["write"]
    assert writer.fencing_token  # taken on first use: the fencing counter is made
    writer.release()
    assert rw.holders() == []
    leftovers = [k for k in redis_client.keys("redislock:{doc}:*") if not k.endswith(b":rw:fence")]
    assert leftovers == []
    assert redis_client.pttl("redislock:{doc}:rw:fence") > 0


def test_context_managers_and_timeout() -> None:
    rw = ReadWriteLock("cm", blocking_timeout=0.05)
    with rw.read() as reader:
        assert reader.owned()
        assert reader.fencing_token is not None
        with rw.read():
            pass
        with pytest.raises(LockTimeout, match="for writing"), rw.write():
            pass
    with rw.write(), pytest.raises(LockTimeout, match="for reading"), rw.read():
        pass


def test_waiting_writer_blocks_new_readers() -> None:
    rw = ReadWriteLock("pref", timeout=30)
    reader = rw.read()
    reader.acquire()
    got: list[float] = []

    def write() -> None:
        with rw.write():
            got.append(time.monotonic())

    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.monotonic() + 5
    while True:  # until the writer is queued
        late = rw.read()
        if not late.acquire(blocking=False):
            break
        late.release()
        assert time.monotonic() < deadline, "the writer never queued"
        time.sleep(0.01)
    assert not rw.read().acquire(blocking=False)  # a writer waits: no new readers
    reader.release()
    thread.join(5)
    assert got


def test_release_errors(redis_client: redis.Redis) -> None:
    rw = ReadWriteLock("err", timeout=5, auto_renew=False)
    reader = rw.read()
    with pytest.raises(LockNotOwnedError):
        reader.release()
    reader.acquire()
    redis_client.delete("redislock:{err}:rwlock")
    with pytest.raises(LockLostError):
        reader.release()


def test_inspection_and_clear(redis_client: redis.Redis) -> None:
    rw = ReadWriteLock("ins", timeout=5, auto_renew=False)
    a, b = rw.read(), rw.read()
    a.acquire()
    b.acquire()
    [info] = list_held(redis_client, "redislock", selected=["rwlock"])
    assert (info.kind, info.extra["mode"], len(info.holders)) == ("rwlock", "read", 2)
    assert clear(redis_client, "redislock", "ins") == 2
    assert rw.write().acquire(blocking=False)
    with pytest.raises(LockLostError):
        a.release()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name must not be empty"):
        ReadWriteLock("")
    with pytest.raises(ValueError, match="timeout must be positive"):
        ReadWriteLock("x", timeout=0)


# --- real processes --------------------------------------------------------------


@pytest.mark.usefixtures("real_redis")
def test_readers_overlap_and_writers_overlap_nothing() -> None:
    readers, writers = Gauge(), Gauge()
    start = CTX.Barrier(6)
    args = [("mix", False, 30, readers, writers, start)] * 4
    args += [("mix", True, 30, readers, writers, start)] * 2
    with processes(_mixed_worker, args):
        pass
    assert readers.entries == 4 * 30
    assert writers.entries == 2 * 30
    assert readers.peak >= 2
    assert writers.peak == 1


@pytest.mark.usefixtures("real_redis")
def test_writer_gets_in_despite_a_stream_of_readers() -> None:
    """Four processes keep the read side held without a gap; a writer still gets in.

    Without writer preference the readers' holds overlap, the lock is never
    free, and the writer would wait until its blocking timeout.
    """
    readers = Gauge()
    stop = CTX.Event()
    with processes(_reader_stream, [("stream", stop, readers)] * 4):
        deadline = time.monotonic() + 30
        while readers.entries < 40:  # the stream is flowing in every process
            assert time.monotonic() < deadline, "readers never got going"
            time.sleep(0.02)
        assert readers.peak >= 2
        rw = ReadWriteLock("stream", timeout=10, blocking_timeout=8)
        results = []
        for _ in range(3):
            start = time.monotonic()
            with rw.write():
                results.append(time.monotonic() - start)
                assert readers.now == 0
            time.sleep(0.2)
        stop.set()
    assert max(results) < 3.0, results


def test_a_reader_let_in_from_the_queue_wakes_the_readers_behind_it(
    redis_client: redis.Redis,
) -> None:
    """A writer woken at the head of the queue gives up and passes the wake-up
    to the reader behind it, alone; that reader, let in, wakes the readers
    behind it up to the next writer, instead of leaving them asleep until
    their wait chunk ends (found by an independent review)."""
    from django_redislock.backend.scripts import PERMIT_CANCEL, PERMIT_RELEASE, RWLOCK_ACQUIRE
    from django_redislock.engine.steps import permit_reply

    base = "redislock:{reader-cascade}:"
    parts = ("rwlock", "rw:fence", "rw:queue", "rw:deadlines")
    holders, fence, queue, deadlines = (base + part for part in parts)
    signal = base + "signal:"

    def attempt(token: str) -> int:
        """1: granted, 0: refused and queued."""
        member = f"{token}:0:0:1:host:1:MainThread"  # <token>:<fence>:<limit>:<since_ms>:<holder>
        keys = [holders, fence, queue, deadlines]
        return permit_reply(RWLOCK_ACQUIRE(redis_client, keys, [member, 30_000, 3_000, 0]))[0]

    assert attempt("w1") == 1
    for token in ("w2", "r1", "r2", "r3", "w3", "r4"):
        assert attempt(token) == 0  # queued, in this order
    member = redis_client.zrange(holders, 0, 0)[0]
    assert PERMIT_RELEASE(redis_client, [holders, queue, deadlines], [member]) == 1
    assert redis_client.llen(signal + "w2") == 1  # the head, a writer, alone is woken
    assert PERMIT_CANCEL(redis_client, [holders, queue, deadlines], ["w2"]) == 1
    assert redis_client.llen(signal + "r1") == 1  # the wake-up passed on, to r1 alone
    assert redis_client.llen(signal + "r2") == 0
    redis_client.delete(signal + "r1")  # r1 read it
    assert attempt("r1") == 1
    assert redis_client.llen(signal + "r2") == 1 and redis_client.llen(signal + "r3") == 1
    assert redis_client.llen(signal + "w3") == 0 and redis_client.llen(signal + "r4") == 0


def test_errors_name_a_read_write_lock_in_words() -> None:
    with pytest.raises(LockNotOwnedError, match=r"^Read-write lock 'worded' is not held"):
        ReadWriteLock("worded").write().release()
