"""A permit's fencing token costs nothing unless used: taken on first use by
one owner-checked call, or by the acquire when asked for up front
(``fencing=True``), for ``Semaphore``, ``AsyncSemaphore`` and both sides of a
``ReadWriteLock``. Tokens stay strictly increasing per name across holders,
whichever way each was taken."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import (
    AsyncReadWriteLock,
    AsyncSemaphore,
    LockLostError,
    ReadWriteLock,
    Semaphore,
    signals,
)
from django_redislock.backend.scripts import PERMIT_EXTEND, PERMIT_FENCE
from django_redislock.ops.inspection import describe

SET = "redislock:{%s}:semaphore"


def _member(redis_client: redis.Redis, name: str) -> str:
    (member,) = redis_client.zrange(SET % name, 0, -1)
    return member.decode()


def test_an_acquire_takes_no_token_and_the_first_use_takes_one(redis_client: redis.Redis) -> None:
    sem = Semaphore("lazy", 2)
    with sem:
        assert not redis_client.exists("redislock:{lazy}:sem:fence")  # nothing taken
        assert _member(redis_client, "lazy").split(":")[1] == "0"
        assert [h.fencing_token for h in sem.holders()] == [None]
        token = sem.fencing_token
        assert isinstance(token, int) and token > 0
        assert _member(redis_client, "lazy").split(":")[1] == str(token)  # in the member
        assert [h.fencing_token for h in sem.holders()] == [token]
        (info,) = describe(redis_client, "redislock", "lazy")  # the dashboard's and locks'
        assert info.kind == "semaphore" and info.fencing_token == token
        assert ":" in info.holders[0].holder and info.holders[0].ttl
        assert sem.fencing_token == token  # read again: the same, no round trip
        assert sem.owned()
    assert not redis_client.exists(SET % "lazy")


def test_a_token_asked_for_up_front_comes_with_the_acquire(redis_client: redis.Redis) -> None:
    got: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append(kwargs["fencing_token"])

    signals.lock_acquired.connect(receiver)
    try:
        with Semaphore("eager", 2, fencing=True) as sem:
            latest = sem._latest()
            assert latest is not None and latest.fencing_token  # before any read
            assert [h.fencing_token for h in sem.holders()] == [latest.fencing_token]
            assert sem.fencing_token == latest.fencing_token
        with Semaphore("eager", 2):
            pass
    finally:
        signals.lock_acquired.disconnect(receiver)
    assert got[0] == latest.fencing_token and got[1] is None  # lazy: None in the signal


def test_a_lost_permit_raises_and_gets_no_token(redis_client: redis.Redis) -> None:
    sem = Semaphore("gone", 1, auto_renew=False)
    sem.acquire()
    redis_client.delete(SET % "gone")
    with pytest.raises(LockLostError):
        sem.fencing_token  # noqa: B018
    with pytest.raises(LockLostError):
        sem.fencing_token  # noqa: B018  - told again, with no token
    with pytest.raises(LockLostError):
        sem.release()
    assert not redis_client.exists("redislock:{gone}:sem:fence")


def test_an_ended_lease_gets_no_token(redis_client: redis.Redis) -> None:
    """A permit whose score says its lease ended (pruned by nobody yet) is lost."""
    holder, other = Semaphore("ended", 2, auto_renew=False), Semaphore("ended", 2)
    holder.acquire()
    other.acquire()  # two holders: each is scored by its lease end
    member = holder._latest().token  # type: ignore[union-attr]
    redis_client.zadd(SET % "ended", {member: 1})  # its lease ended long ago
    with pytest.raises(LockLostError):
        holder.fencing_token  # noqa: B018
    assert other.fencing_token
    other.release()


def test_tokens_strictly_increase_across_holders_eager_and_lazy() -> None:
    tokens = []
    for i in range(8):
        with Semaphore("mixed-fence", 3, fencing=bool(i % 2)) as sem:
            tokens.append(sem.fencing_token)
    held = [Semaphore("mixed-fence", 3, fencing=f) for f in (False, True, False)]
    for sem in held:
        sem.acquire()
    # the lazy first permit takes its token after the eager second one
    tokens += [held[1].fencing_token, held[0].fencing_token, held[2].fencing_token]
    for sem in held:
        sem.release()
    rw = ReadWriteLock("mixed-fence")
    with rw.read() as reader:
        tokens.append(reader.fencing_token)
    with ReadWriteLock("mixed-fence", fencing=True).write() as writer:
        tokens.append(writer.fencing_token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_tokens_increase_across_threads_taking_them_lazily() -> None:
    tokens: list[int] = []
    lock = threading.Lock()

    def work(fencing: bool) -> None:
        for _ in range(10):
            with Semaphore("threads-fence", 2, fencing=fencing, blocking_timeout=20) as sem:
                with lock:  # taken in the order they are appended
                    tokens.append(sem.fencing_token)  # type: ignore[arg-type]

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tokens) == 40 and len(set(tokens)) == 40


def test_renewals_keep_a_permit_whose_token_was_taken(redis_client: redis.Redis) -> None:
    """Taking the token renames the member; a renewal sent under the old name
    (on its way meanwhile) still finds it, and the watchdog renews the new one."""
    sem = Semaphore("renamed", 2, timeout=0.6)
    sem.acquire()
    other = Semaphore("renamed", 2)
    other.acquire()  # two holders: leases are scores, not the key's TTL
    old = sem._latest().token  # type: ignore[union-attr]
    assert sem.fencing_token
    assert sem._latest().token != old  # type: ignore[union-attr]
    keys = [SET % "renamed"]
    assert PERMIT_EXTEND(redis_client, keys, PERMIT_EXTEND.args_of(token=old, lease_ms=600)) == 1
    time.sleep(1.5)  # past two leases: the watchdog renewed it
    assert sem.owned()
    sem.release()
    other.release()
    assert not redis_client.exists(SET % "renamed")


@pytest.mark.parametrize("holders", [1, 2])
def test_a_fence_call_whose_reply_was_lost(redis_client: redis.Redis, holders: int) -> None:
    """The fence call ran but its reply never came back (the holder still
    knows its permit by the old member): sent again, it answers the same
    token, and the release finds the renamed permit by its token."""
    others = [Semaphore("again", 2) for _ in range(holders - 1)]
    for other in others:
        other.acquire()
    with Semaphore("again", 2) as sem:
        old = sem._latest().token  # type: ignore[union-attr]
        keys = [SET % "again", "redislock:{again}:sem:fence"]
        first = PERMIT_FENCE(redis_client, keys, [old])  # the reply "lost"
        assert PERMIT_FENCE(redis_client, keys, [old]) == first > 0
        assert redis_client.pttl(SET % "again") > 0  # renamed in place: the TTL kept
        assert sem._latest().token == old  # type: ignore[union-attr]
        assert PERMIT_EXTEND(
            redis_client, keys[:1], PERMIT_EXTEND.args_of(token=old, lease_ms=9000)
        )
    # released without LockLostError, under the old member
    assert redis_client.zcard(SET % "again") == holders - 1
    for other in others:
        other.release()
    assert not redis_client.exists(SET % "again")


def test_async_token_on_first_await_and_up_front(redis_client: redis.Redis) -> None:
    async def main() -> list[int | None]:
        tokens: list[int | None] = []
        async with AsyncSemaphore("aio-fence", 2) as sem:
            assert not redis_client.exists("redislock:{aio-fence}:sem:fence")
            tokens.append(await sem.get_fencing_token())
            assert await sem.get_fencing_token() == tokens[-1]
            assert sem.fencing_token == tokens[-1]
        async with AsyncSemaphore("aio-fence", 2, fencing=True) as sem:
            latest = sem._latest()
            assert latest is not None and latest.fencing_token
            tokens.append(await sem.get_fencing_token())
        async with AsyncSemaphore("aio-fence", 2) as sem:
            tokens.append(sem.fencing_token)  # the blocking property works too
        async with AsyncReadWriteLock("aio-fence").write() as writer:
            tokens.append(await writer.get_fencing_token())
        assert await AsyncSemaphore("aio-fence", 2).get_fencing_token() is None  # none held
        return tokens

    tokens = asyncio.run(main())
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_async_lost_permit_raises(redis_client: redis.Redis) -> None:
    async def main() -> None:
        sem = AsyncSemaphore("aio-gone", 1, auto_renew=False)
        await sem.acquire()
        redis_client.delete(SET % "aio-gone")
        with pytest.raises(LockLostError):
            await sem.get_fencing_token()
        with pytest.raises(LockLostError):
            await sem.release()

    asyncio.run(main())


@pytest.mark.parametrize("fencing", [1, "yes", None])
def test_fencing_must_be_a_bool(fencing: object) -> None:
    with pytest.raises(TypeError):
        Semaphore("x", 1, fencing=fencing)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ReadWriteLock("x", fencing=fencing)  # type: ignore[arg-type]
