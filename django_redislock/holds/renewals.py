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

Each renewal's outcome is what it would be alone (``Holding.renewal``): a
lease found not ours is lost unless a release is on its way; an ``extend()``
that crossed the call makes that renewal send the new lease once more (all
such in one more call); an error reply for one key (a key of another type)
fails that renewal only, and the call's own error (the server unreachable)
fails each renewal of the call, with its own name, for the watchdog to retry
or give up on as it would one sent alone.

Sent alone (``Renewable.renew``): a lane's only renewal waiting, a
``Redlock``'s (it waits on several servers at once), and one whose holding
renews its own way. A call has no deadline of its own, as a renewal sent
alone has none: the watchdog reports each renewal still unanswered at its own
lease end, the call's earliest first.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Generator, Hashable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from redis.exceptions import ResponseError

from django_redislock.backend.client import BACKEND_ERRORS, backend_error
from django_redislock.backend.scripts import (
    LOCK_EXTEND,
    LOCK_RENEW,
    PERMIT_EXTEND,
    PERMIT_RENEW,
    Script,
)

#: The most renewals one call carries by default (``RENEWAL_BATCH``): a few
#: hundred keep one call around a millisecond of the server's time.
MAX_BATCH = 256

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
    """What the watchdog needs of a holding; the lease's state (``token`` to
    ``releasing``) only of one with a ``batch_client``."""

    lease_deadline: float
    name: str
    renew_script: Script
    renew_keys: Sequence[str | bytes]
    token: str
    lease: float
    lease_generation: int
    lease_lock: threading.Lock
    renewing_lease: float | None
    active: bool
    releasing: bool
    watch_state: int

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

    def renewal(self) -> Generator[float, bool, bool]:
        """``renew``'s steps: yields each lease to send, takes the answer."""

    def deadline_of(self, started: float, lease: float) -> float: ...

    def mark_lost(self, reason: str) -> None: ...


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
    together: dict[tuple[int, str, int | None], list[Renewable]] = {}
    for ref in refs:
        holding = ref()
        if holding is None:
            continue
        client = holding.batch_client
        script = None if client is None else BATCHED.get(holding.renew_script.sha)
        if client is None or script is None:
            yield _alone(holding)
        else:
            together.setdefault((id(client), script.sha, holding.batch_slot), []).append(holding)
        holding = client = None  # kept by nobody while the next is renewed
    for group in together.values():
        yield from (_together(group) if len(group) > 1 else [_alone(group[0])])


def _alone(holding: Renewable) -> Result:
    started = time.monotonic()
    try:
        return holding, started, holding.renew()
    except Exception as exc:
        return holding, started, exc


def _together(holdings: list[Renewable]) -> list[Result]:
    """Renewals of one client, batch script and slot: one call per lease
    they carry; then, in one more per lease, those an extend crossed (as
    ``Holding.renewal``, at most two sends each)."""
    client = holdings[0].batch_client
    script = BATCHED[holdings[0].renew_script.sha]
    started = time.monotonic()
    results: list[Result] = []
    pending = holdings
    for _ in range(2):
        crossed: list[Renewable] = []
        for lease, sent in _by_lease(pending, results, started).items():
            crossed += _send(script, client, lease, sent, results, started)
        pending = crossed
        if not pending:
            return results
    # Crossed twice: the deadline stays where the extends put it (the earlier
    # end), by which the watchdog comes back soon.
    results.extend((holding, started, True) for holding in pending)
    return results


def _by_lease(
    holdings: list[Renewable], results: list[Result], started: float
) -> dict[float, list[tuple[Renewable, int]]]:
    """The live holdings by the lease each sends now (marked on its way,
    ``renewing_lease``), with their lease's generation; one released
    meanwhile is done."""
    by_lease: dict[float, list[tuple[Renewable, int]]] = {}
    for holding in holdings:
        if not holding.active:
            results.append((holding, started, True))
            continue
        with holding.lease_lock:
            generation = holding.lease_generation
            lease = holding.renewing_lease = holding.lease
        by_lease.setdefault(lease, []).append((holding, generation))
    return by_lease


def _send(
    script: Script,
    client: Any,
    lease: float,
    sent: list[tuple[Renewable, int]],
    results: list[Result],
    started: float,
) -> list[Renewable]:
    """One call renewing ``sent`` to ``lease``; each outcome to ``results``
    but those an extend crossed, which are returned (to send again)."""
    called = time.monotonic()
    args: list[Any] = [int(lease * 1000)]
    args += [holding.token for holding, _ in sent]
    try:
        reply = script(client, [holding.renew_keys[0] for holding, _ in sent], args)
    except Exception as exc:
        failed: dict[int, Any] | Exception = exc
    else:
        failed = {int(reply[i]) - 1: reply[i + 1] for i in range(0, len(reply), 2)}
    crossed = []
    for index, (holding, generation) in enumerate(sent):
        code = failed if isinstance(failed, Exception) else failed.get(index, True)
        with holding.lease_lock:
            holding.renewing_lease = None
            if code is True and generation == holding.lease_generation:
                holding.lease_deadline = holding.deadline_of(called, lease)
                results.append((holding, started, True))
                continue
        if code is True:
            crossed.append(holding)
        elif code == 0:
            # A release sent while this renewal was on its way may have run
            # first on the server: then "not ours" is the release, not a loss.
            results.append((holding, started, holding.releasing))
        else:
            results.append((holding, started, _error(holding.name, code)))
    return crossed


def _error(name: str, code: Any) -> Exception:
    """A renewal's error as sent alone: a Redis one (the call's, or its key's
    error text in the reply) as ``LockBackendError`` with the cause chained."""
    if isinstance(code, bytes | str):
        code = ResponseError(code.decode() if isinstance(code, bytes) else code)
    if isinstance(code, BACKEND_ERRORS):
        error = backend_error(name, code)
        error.__cause__ = code
        return error
    if isinstance(code, Exception):
        return code
    return RuntimeError(f"unexpected renewal reply for {name!r}: {code!r}")
