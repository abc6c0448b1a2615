"""``Leadership`` and ``AsyncLeadership`` in one process: election, resign, loss, leader_of.

The claims that need processes (a leader killed, paused, Redis restarted) are
proven with ``manage.py lead`` runners in ``tests/management/commands/test_lead.py``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import AsyncLeadership, Leadership, LockTimeout
from django_redislock.primitives.leadership_common import LEADER_PREFIX
from tests.support.other_holders import OtherThread


def lock_key(name: str) -> str:
    return f"redislock:{{{LEADER_PREFIX}{name}}}:lock"


def test_the_first_campaigner_leads_and_a_second_waits_until_it_resigns(
    other_thread: OtherThread,
) -> None:
    elected: queue.SimpleQueue[str] = queue.SimpleQueue()
    first = Leadership("beat", timeout=5, on_elected=lambda leader: elected.put("first"))
    second = Leadership("beat", timeout=5, on_elected=lambda leader: elected.put("second"))
    assert first.campaign()
    assert first.is_leader and elected.get(timeout=5) == "first"
    assert first.fencing_token is not None
    waiting = threading.Thread(target=second.campaign)
    waiting.start()
    info = Leadership.leader_of("beat")
    assert info is not None and info.fencing_token == first.fencing_token
    assert not second.is_leader
    first.resign()
    assert not first.is_leader  # at once
    assert elected.get(timeout=10) == "second"
    waiting.join(10)
    assert second.is_leader
    assert second.fencing_token is not None and first.fencing_token is None
    assert second.fencing_token > info.fencing_token
    second.resign()
    assert Leadership.leader_of("beat") is None


def test_with_resigns_at_the_end_and_a_bounded_campaign_raises_lock_timeout(
    other_thread: OtherThread,
) -> None:
    with Leadership("sched", timeout=5) as leader:
        assert leader.is_leader
        other = Leadership("sched", blocking_timeout=0.2)
        assert not other_thread(other.campaign)
        with pytest.raises(LockTimeout):
            other_thread(other.__enter__)
        assert other_thread(other.campaign, blocking_timeout=0) is False
    assert not leader.is_leader
    assert Leadership.leader_of("sched") is None


def test_resign_from_another_thread_releases_the_hold_taken_in_this_one(
    other_thread: OtherThread,
) -> None:
    leader = Leadership("x", timeout=5)
    assert leader.campaign()
    with pytest.raises(RuntimeError, match="already leads"):
        Leadership("x").campaign()  # the same thread, another object: refused, not nested
    assert leader.is_leader
    other_thread(leader.resign)
    assert not leader.is_leader
    assert Leadership.leader_of("x") is None
    assert leader.campaign()  # campaigning again after a resign is allowed
    leader.resign()


def test_a_lost_lease_steps_the_leader_down_calls_on_revoked_and_campaigns_again(
    redis_client: redis.Redis,
) -> None:
    events: queue.SimpleQueue[tuple[str, bool]] = queue.SimpleQueue()

    def elected(leader: Leadership) -> None:
        events.put(("elected", leader.is_leader))

    def revoked(leader: Leadership) -> None:
        events.put(("revoked", leader.is_leader))
        raise RuntimeError("a callback's failure is logged, never raised")

    leader = Leadership(
        "lost", timeout=0.6, on_elected=elected, on_revoked=revoked, campaign_again=True
    )
    assert leader.campaign()
    assert events.get(timeout=5) == ("elected", True)
    first = leader.fencing_token
    redis_client.delete(lock_key("lost"))  # an operator's clear: the next renewal finds it gone
    assert events.get(timeout=10) == ("revoked", False)
    assert events.get(timeout=10) == ("elected", True)  # campaigned again, in the background
    assert leader.is_leader and leader.terms == 2
    assert leader.fencing_token is not None and first is not None
    assert leader.fencing_token > first
    # the campaign's thread has ended; its term is still renewed, well past three leases
    assert not leader.wait_revoked(timeout=2.5)
    info = Leadership.leader_of("lost")
    assert info is not None and info.fencing_token == leader.fencing_token
    leader.resign()
    assert Leadership.leader_of("lost") is None


def test_a_leader_that_loses_without_campaign_again_stays_down(redis_client: redis.Redis) -> None:
    leader = Leadership("down", timeout=0.6)
    assert leader.campaign()
    redis_client.delete(lock_key("down"))
    assert leader.wait_revoked(timeout=10)
    assert not leader.is_leader
    leader.resign()  # nothing to release: no error
    assert Leadership.leader_of("down") is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": 0}, ValueError),
        ({"blocking_timeout": -1}, ValueError),
        ({"on_elected": "nope"}, TypeError),
        ({"on_revoked": 3}, TypeError),
        ({"campaign_again": "yes"}, TypeError),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        Leadership("x", **kwargs)
    with pytest.raises(error):
        AsyncLeadership("x", **kwargs)


def test_a_bad_name_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        Leadership("")
    with pytest.raises(TypeError):
        Leadership.leader_of(3)  # type: ignore[arg-type]


def test_async_leadership_elects_resigns_and_steps_down_on_loss(redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        revoked = asyncio.Event()

        async def on_revoked(leader: AsyncLeadership) -> None:
            revoked.set()

        async with AsyncLeadership("aio", timeout=0.6, on_revoked=on_revoked) as leader:
            assert leader.is_leader and leader.fencing_token
            standby = AsyncLeadership("aio", blocking_timeout=0.2)
            assert not await asyncio.create_task(standby.campaign())  # another task: waits
            with pytest.raises(RuntimeError, match="already leads"):
                await standby.campaign()  # the same task: refused, not nested
            assert not await leader.wait_revoked(timeout=0.1)  # still leading: False
            redis_client.delete(lock_key("aio"))
            assert await leader.wait_revoked(timeout=10)  # awaited: the loop runs on
            await asyncio.wait_for(revoked.wait(), 10)
            assert not leader.is_leader
            assert await leader.wait_revoked(timeout=0)  # not leading: at once

            async def take_over() -> None:
                assert await standby.campaign(blocking_timeout=5)
                await standby.resign()

            await asyncio.create_task(take_over())
        assert AsyncLeadership.leader_of("aio") is None

    asyncio.run(scenario())


def test_elections_resignations_and_revocations_are_the_lock_signals_of_kind_leadership(
    redis_client: redis.Redis,
) -> None:
    from django_redislock import signals
    from tests.support.signals_helper import capture

    with (
        capture(signals.lock_acquired) as acquired,
        capture(signals.lock_released) as released,
        capture(signals.lock_lost) as lost,
    ):
        leader = Leadership("sig", timeout=0.6)
        assert leader.campaign()
        leader.resign()
        assert leader.campaign()
        redis_client.delete(lock_key("sig"))
        assert leader.wait_revoked(timeout=10)
    assert [(c["name"], c["kind"]) for c in acquired] == [("leader:sig", "leadership")] * 2
    assert acquired[0]["fencing_token"] is not None
    assert [(c["name"], c["kind"]) for c in released] == [("leader:sig", "leadership")]
    assert [(c["name"], c["kind"]) for c in lost] == [("leader:sig", "leadership")]


def test_async_campaign_again_is_re_elected_and_renewed_after_its_task_ends(
    redis_client: redis.Redis,
) -> None:
    async def scenario() -> None:
        elected = asyncio.Queue[int]()

        async def on_elected(leader: AsyncLeadership) -> None:
            await elected.put(leader.terms)

        leader = AsyncLeadership(
            "aio-again", timeout=0.6, on_elected=on_elected, campaign_again=True
        )
        assert await leader.campaign()
        assert await asyncio.wait_for(elected.get(), 10) == 1
        redis_client.delete(lock_key("aio-again"))
        assert await asyncio.wait_for(elected.get(), 10) == 2
        await asyncio.sleep(2.5)  # three leases: the term must be renewed, not lapse
        assert leader.is_leader
        info = AsyncLeadership.leader_of("aio-again")
        assert info is not None and info.fencing_token == leader.fencing_token
        await leader.resign()
        assert AsyncLeadership.leader_of("aio-again") is None

    asyncio.run(scenario())


def _clear(redis_client: redis.Redis, name: str) -> None:
    """An operator's clear (``manage.py locks clear``): wakes the first standby."""
    from django_redislock.ops.kinds import LeadershipKind

    assert LeadershipKind().clear(redis_client, "redislock", LEADER_PREFIX + name) == 1


def _revoked_and_queued_behind(
    redis_client: redis.Redis, name: str
) -> tuple[Leadership, Leadership]:
    """``first`` led with campaign_again; ``second`` took over after a clear,
    and ``first`` campaigns again in the background, queued behind it."""
    first = Leadership(name, timeout=0.6, campaign_again=True)
    assert first.campaign()
    second = Leadership(name, timeout=5)
    waiting = threading.Thread(target=second.campaign)
    waiting.start()
    deadline = time.monotonic() + 20
    while not redis_client.zcard(f"redislock:{{{LEADER_PREFIX}{name}}}:queue"):
        assert time.monotonic() < deadline, "the standby never queued"
        time.sleep(0.01)
    _clear(redis_client, name)
    waiting.join(20)
    assert second.is_leader
    assert first.wait_revoked(timeout=10)
    while not redis_client.zcard(f"redislock:{{{LEADER_PREFIX}{name}}}:queue"):
        assert time.monotonic() < deadline, "the background campaign never queued"
        time.sleep(0.01)
    return first, second


def test_campaign_waits_for_the_background_campaign_instead_of_queueing_beside_it(
    redis_client: redis.Redis,
) -> None:
    first, second = _revoked_and_queued_behind(redis_client, "bg")
    result: list[bool] = []
    asking = threading.Thread(target=lambda: result.append(first.campaign(blocking_timeout=20)))
    asking.start()
    second.resign()  # the lease goes to the background campaign, first in line
    asking.join(30)
    assert result == [True] and first.is_leader and first.terms == 2
    assert redis_client.zcard(f"redislock:{{{LEADER_PREFIX}bg}}:queue") == 0
    first.resign()


def test_a_resign_stops_the_background_campaign_for_good(redis_client: redis.Redis) -> None:
    first, second = _revoked_and_queued_behind(redis_client, "stop")
    background = first._background
    assert background is not None
    first.resign()
    second.resign()  # hands the lease to the background campaign, which must give it back
    background.join(30)
    assert not background.is_alive()
    assert first.terms == 1 and not first.is_leader
    assert Leadership.leader_of("stop") is None
