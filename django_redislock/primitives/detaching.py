"""A ``Lock`` hold handed to another thread or process: ``detach()`` and
``Lock.adopt(ticket)``, written once as steps for ``Lock`` and ``AsyncLock``.

Timeline of a hand-over (``docs/long-holds.md``)::

    view:   holds (token A); detach -> Redis: A becomes T, a full lease from
            now, holder marked detached; the ticket carries T; renews nothing
    worker: adopt(ticket) -> Redis: T becomes B, only if T holds it (one script)
    worker: holds (token B), renewed by its watchdog, released at its end

Each swap is one owner-checked script (``lock_detach.lua``,
``lock_adopt.lua``), so the ticket works once: a second adopter finds B
where T was. The fencing token, the waiters and the hold's start stay.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_redislock import signals
from django_redislock.backend.scripts import LOCK_ADOPT, LOCK_DETACH
from django_redislock.engine import steps as protocol
from django_redislock.engine.steps import Call, Step
from django_redislock.exceptions import LockBackendError, LockLostError
from django_redislock.holds import counters
from django_redislock.holds.holding import Holding, holder_description, new_token
from django_redislock.holds.registry import supersede
from django_redislock.holds.tickets import NOT_ADOPTED, Ticket
from django_redislock.holds.watchdog import watchdog

if TYPE_CHECKING:
    from django_redislock.primitives.base import Resolved
    from django_redislock.primitives.lock_common import LockBase

#: What the adopt script's refusals mean (``lock_adopt.lua``).
_REFUSED = {
    -1: "its lease ran out (or it was released or cleared) before the ticket was adopted",
    -2: "another holder has it: the ticket was adopted already "
    "(or its lease ran out and the name was taken again)",
}


def detach_steps(handle: LockBase, holding: Holding | None) -> Generator[Step, Any, str]:
    """Hand ``holding`` (the handle's current hold) off; its ticket.

    Only an outermost hold: a nested level belongs to a caller that will
    still release it. A detach Redis did not answer stops the renewals as a
    failed release does (the lease frees the lock) and raises
    ``LockBackendError`` (``LockLostError`` when the lease had lapsed)."""
    if holding is None:
        raise handle._not_owned()
    if holding.depth > 1:
        raise RuntimeError(
            f"Lock {handle.name!r} is held {holding.depth} levels deep by this holder: only "
            "an outermost hold can be detached (its inner levels are released first)."
        )
    if holding.lost is not None:
        raise handle._lost(holding)
    resolved = handle._resolve()
    token = new_token()
    lease_ms = int(holding.lease * 1000)
    holding.releasing = True  # a renewal crossing the swap finds it gone: no loss
    call = Call(
        LOCK_DETACH,
        LOCK_DETACH.keys_of({"lock": holding.keys[0]}),
        LOCK_DETACH.args_of(token=holding.token, ticket=token, lease_ms=lease_ms,
                            holder=holding.holder),
    )  # fmt: skip
    sent = time.monotonic()
    try:
        fence, now_ms = yield from protocol.single(call, handle.name)
    except LockBackendError as exc:
        error = handle._unreachable(holding, exc, sent, "detached it")
        _over(holding)
        raise error from error.__cause__
    except BaseException:
        _over(holding)
        raise
    if int(fence) < 0:
        holding.mark_lost("the lease was gone when the holder detached it")
        holding.end()
        raise handle._lost(holding)
    _over(holding)
    signals.announce_released(handle, holding.acquired_at)
    return Ticket(
        kind=handle.kind,
        name=handle.name,
        using=resolved.alias,
        prefix=handle._prefix(resolved.settings),
        token=token,
        fence=int(fence),
        lease_ms=lease_ms,
        detached_ms=int(now_ms),
    ).dumps()


def _over(holding: Holding) -> None:
    """The hold is no longer this holder's: not renewed, not released (a
    ``with`` block around the detach leaves it alone)."""
    holding.detached = True
    holding.end()


def adoptable(handle: LockBase, ticket: Ticket) -> Resolved:
    """``handle``'s resolution, for adopting ``ticket``: ``ValueError`` for
    another primitive's ticket, ``ImproperlyConfigured`` when this process's
    settings put the name's keys elsewhere than the detacher's did."""
    if ticket.kind != handle.kind:
        raise ValueError(f"This ticket is a {ticket.kind}'s, not a {handle.kind}'s.")
    resolved = handle._resolve()
    prefix = handle._prefix(resolved.settings)
    if prefix != ticket.prefix:
        raise ImproperlyConfigured(
            f"Lock {ticket.name!r} was detached with its keys under {ticket.prefix!r}, but "
            f"this process puts them under {prefix!r}: REDISLOCK['KEY_PREFIX'] or cache "
            f"{ticket.using!r}'s KEY_PREFIX or VERSION differ between the two."
        )
    return resolved


def adopt_steps(
    handle: LockBase, ticket: Ticket, resolved: Resolved
) -> Generator[Step, Any, Holding]:
    """Take the detached hold over for the current holder: held, renewed by
    this process's watchdog (unless ``auto_renew`` is off), releasable by
    ``handle`` and nested into by the holder's other handles.
    ``LockLostError`` when the ticket is spent or its lease ran out."""
    handles = handle._handles
    registry = handles.registry()
    pid = registry.pid
    if resolved.auto_renew:
        watchdog.ensure_running(pid)
    token, holder = new_token(), holder_description(pid)
    call = Call(
        LOCK_ADOPT,
        resolved.keys_for(LOCK_ADOPT),
        LOCK_ADOPT.args_of(ticket=ticket.token, token=token, lease_ms=ticket.lease_ms,
                           holder=holder),
    )  # fmt: skip
    started = time.monotonic()
    fence = int((yield from protocol.single(call, handle.name)))
    if fence < 0:
        raise LockLostError(
            f"Lock {ticket.name!r} was not adopted: {_REFUSED[fence]}; {NOT_ADOPTED}.",
            name=ticket.name,
        )
    hold_key = resolved.hold_key
    stale = handles.reentry(hold_key, registry)
    if stale is not None:  # Redis says the ticket's hold is the name's: this one is gone
        supersede(stale, "the holder adopted the name's detached hold")
    holding = handle._new_holding(token, holder, resolved, started, fence, pid)
    handles.took(handle, hold_key, holding, registry)
    if resolved.auto_renew:
        watchdog.watch(holding)
    counters.acquired(None, None, 0, handle.name)  # the history's; no counter counts an adopt
    signals.announce_acquired(handle, 0.0, fence or None)
    return holding


def entering(handle: LockBase, blocks: list[Holding]) -> bool:
    """Record the hold a ``with`` block enters, on ``blocks`` (the current
    holder's, on this handle), for ``leaving`` to know whether it was
    detached inside the block. ``True`` when the block enters the hold that
    ``adopt()`` made this handle for (``with Lock.adopt(ticket) as lock:``)
    rather than acquiring again, which would nest into it and leave it held
    at the block's end; once only: a later block acquires as any does."""
    adopted, handle._adopted = handle._adopted, None
    if adopted is not None and adopted.active and adopted in handle._handles.entered(handle):
        blocks.append(adopted)
        return True
    return False


def entered(handle: LockBase, blocks: list[Holding]) -> None:
    """After a ``with`` block's acquire: the hold it entered, on ``blocks``."""
    taken = handle._handles.entered(handle)
    if taken:
        blocks.append(taken[-1])


def leaving(handle: LockBase, blocks: list[Holding]) -> bool:
    """Whether the ``with`` block being left had its hold detached inside
    it: then there is nothing of this holder's to release. Left without
    ``__enter__`` (``@require_lock``'s guard acquires its own way), the
    handle's latest hold says, which ``Handles.taken`` keeps until then."""
    if blocks:
        if not blocks.pop().detached:  # the common case: released as any block's hold is
            return False
        taken = handle._handles.entered(handle)
    else:
        taken = handle._handles.entered(handle)
        if not (taken and taken[-1].detached):
            return False
    if taken and taken[-1].detached:
        taken.pop()
    return True
