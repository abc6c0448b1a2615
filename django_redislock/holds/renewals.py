"""The renewals waiting in one of the watchdog's lanes, many per Redis call.

The watchdog owes a lease a renewal every third of it: 20,000 locks of a
3 s lease are 20,000 renewals a second. Sent one ``EVALSHA`` each, even
pipelined, each cost some 80 us of Python (building, sending and reading a
command, then a reply, per lease), so one process fell behind at about
12,000 a second and lost most of its leases at once.

Now the renewals of one lane that share a client, an extend script and a
lease (and, on Redis Cluster, a hash slot) go in **one script call**
(``lock_renew.lua``, ``permit_renew.lua``: the extend scripts' owner check,
``_lock_value.lua``'s ``extend_lock`` and ``_permits.lua``'s
``renew_holder``, run once per key), up to the ``RENEWAL_BATCH`` setting per
call. The reply lists only the renewals that did not happen, so one where
every lease was renewed costs nothing to read; the Python per lease is a
few attribute reads and writes. The call goes through redis-py's public
``Script`` path (``evalsha``, ``execute_command``): a tracer sees it, a
``NOSCRIPT`` reply loads the script and sends it again.

Each renewal's outcome is what it would be alone, because the call follows
each holding's own rules (``Holding.renewal_started``, ``renewal_ended``)
and only carries what they ask to send: a lease found not ours is lost
unless a release is on its way; an ``extend()`` that crossed the call makes
that renewal send the new lease once more (all such in one more call); an
error reply for one key (a key of another type) fails that renewal only, and
the call's own error (the server unreachable) fails each renewal of the
call, with its own name, for the watchdog to retry or give up on as it would
one sent alone.

Sent alone (``Renewable.renew``): a lane's only renewal waiting, a
``Redlock``'s (it waits on several servers at once), and one whose holding
renews its own way. A call has no deadline of its own, as a renewal sent
alone has none: the watchdog reports each renewal still unanswered at its own
lease end, the call's earliest first.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, cast

from redis.exceptions import ResponseError

from django_redislock.backend import client as backend
from django_redislock.backend.client import backend_error
from django_redislock.backend.scripts import (
    LOCK_EXTEND,
    LOCK_RENEW,
    PERMIT_EXTEND,
    PERMIT_RENEW,
    Script,
)
from django_redislock.engine import pool

#: The most renewals one call carries by default (``RENEWAL_BATCH``): a few
#: hundred keep one call around a millisecond of the server's time.
MAX_BATCH = 256

#: The most times one renewal sends its lease (``Holding.renew``): once, and
#: once more when an ``extend()`` crossed it.
RENEWAL_SENDS = 2

#: Each extend script's batch form, by the extend script's SHA.
BATCHED = {LOCK_EXTEND.sha: LOCK_RENEW, PERMIT_EXTEND.sha: PERMIT_RENEW}

W = TypeVar("W")
R = TypeVar("R")

#: How a renewal ended: ``True`` renewed (or nothing left to renew), ``False``
#: the lease is no longer ours, or the error that kept it from being renewed.
Outcome = bool | Exception
#: A renewal: its holding, when it was sent, and how it ended.
Result = tuple["Renewable", float, Outcome]


class Renewable(Protocol):
    """What the watchdog needs of a holding (``Batched``: and of one that
    can be renewed with others)."""

    lease_deadline: float
    name: str
    renew_script: Script
    active: bool
    watch_state: int
    #: What the holder asked for on loss (``holds/losses.py``), or ``None``.
    hooks: Any

    @property
    def renew_interval(self) -> float: ...

    @property
    def lane(self) -> Hashable:
        """The connection pool the renewal goes over: leases with the same
        lane are renewed in one thread, in turn or together."""

    @property
    def batch_client(self) -> Any:
        """The client whose script calls may carry this renewal with others of
        the same client; ``None``: renewed alone."""

    @property
    def batch_slot(self) -> int | None:
        """The Redis Cluster hash slot of its key (``None`` off Cluster)."""

    def renew(self) -> bool:
        """Extend the lease one more term, alone; ``False`` if it is no longer ours."""

    def mark_lost(self, reason: str) -> None: ...


class Batched(Renewable, Protocol):
    """A holding with a ``batch_client``: what one script call carries of
    it, and the renewal rules ``Holding.renew`` follows alone."""

    renew_keys: Sequence[str | bytes]
    token: str

    def renewal_started(self) -> tuple[float, int] | None: ...

    def renewal_ended(
        self, lease: float, generation: int, started: float, ours: bool | None
    ) -> bool | None: ...


def take_batch(jobs: deque[tuple[W, R]], limit: int = MAX_BATCH) -> tuple[W, list[R]]:
    """From a lane's queue of ``(function, item)`` jobs: the next one's
    function, with the items of the jobs for it waiting right behind, up to
    ``limit`` in all (the function takes them together)."""
    work, first = jobs.popleft()
    taken = [first]
    while jobs and len(taken) < limit and jobs[0][0] == work:
        taken.append(jobs.popleft()[1])
    return work, taken


def renew_all(refs: Iterable[weakref.ref[Renewable]]) -> Iterator[Result]:
    """Renew the holdings still alive of ``refs``: those that can share a
    script call (``batch_client``, a batch script, a slot) in one, the others
    alone. An error never escapes: it is that renewal's outcome."""
    together: dict[tuple[int, str, int | None], list[Batched]] = {}
    for ref in refs:
        holding = ref()
        if holding is None:
            continue
        client = holding.batch_client
        script = None if client is None else BATCHED.get(holding.renew_script.sha)
        if client is None or script is None:
            yield _alone(holding)
        else:
            key = (id(client), script.sha, holding.batch_slot)
            together.setdefault(key, []).append(cast("Batched", holding))
        holding = client = None  # kept by nobody while the next is renewed
    for group in together.values():
        yield from (_together(group) if len(group) > 1 else [_alone(group[0])])


def _alone(holding: Renewable) -> Result:
    started = time.monotonic()
    try:
        return holding, started, holding.renew()
    except Exception as exc:
        return holding, started, exc


def _together(holdings: list[Batched]) -> list[Result]:
    """Renewals of one client, batch script and slot, each by its holding's
    own rules (``renewal_started``, ``renewal_ended``, as ``Holding.renew``
    alone): one call per lease they carry, then one more per lease for those
    an extend crossed (at most ``RENEWAL_SENDS`` sends each)."""
    client = holdings[0].batch_client
    script = BATCHED[holdings[0].renew_script.sha]
    started = time.monotonic()
    results: list[Result] = []
    pending = holdings
    for _ in range(RENEWAL_SENDS):
        by_lease: dict[float, list[tuple[Batched, int]]] = {}
        for holding in pending:
            begun = holding.renewal_started()
            if begun is None:  # released meanwhile
                results.append((holding, started, True))
            else:
                by_lease.setdefault(begun[0], []).append((holding, begun[1]))
        pending = []
        for lease, sent in by_lease.items():
            pending += _send(script, client, lease, sent, results, started)
        if not pending:
            return results
    # Crossed every time: as Holding.renew, the deadline stays where the
    # extends put it (the earlier end), by which the watchdog comes back soon.
    results.extend((holding, started, True) for holding in pending)
    return results


def _send(
    script: Script,
    client: Any,
    lease: float,
    sent: list[tuple[Batched, int]],
    results: list[Result],
    started: float,
) -> list[Batched]:
    """One call renewing ``sent`` (each with its lease's generation) to
    ``lease``; each outcome to ``results`` but those to send again (an
    extend crossed them), which are returned."""
    called = time.monotonic()
    args: list[Any] = [int(lease * 1000)]
    args += [holding.token for holding, _ in sent]
    try:
        reply = pool.send(script, client, [holding.renew_keys[0] for holding, _ in sent], args)
    except Exception as exc:
        failed: dict[int, Any] | Exception = exc
    else:
        failed = {int(reply[i]) - 1: reply[i + 1] for i in range(0, len(reply), 2)}
    again = []
    for index, (holding, generation) in enumerate(sent):
        code = failed if isinstance(failed, Exception) else failed.get(index, True)
        ours = True if code is True else False if code == 0 else None
        outcome = holding.renewal_ended(lease, generation, called, ours)
        if ours is None:
            results.append((holding, started, _error(holding.name, code)))
        elif outcome is None:
            again.append(holding)
        else:
            results.append((holding, started, outcome))
    return again


def _error(name: str, code: Any) -> Exception:
    """A renewal's error as sent alone: a Redis one (the call's, or its key's
    error text in the reply) as ``LockBackendError`` with the cause chained."""
    if isinstance(code, bytes | str):
        code = ResponseError(code.decode() if isinstance(code, bytes) else code)
    if isinstance(code, backend.BACKEND_ERRORS):
        error = backend_error(name, code)
        error.__cause__ = code
        return error
    if isinstance(code, Exception):
        return code
    return RuntimeError(f"unexpected renewal reply for {name!r}: {code!r}")
