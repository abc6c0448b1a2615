"""The renewals waiting in one of the watchdog's lanes, sent in one round trip.

A lane sent its renewals one round trip each, so one process could send
about 2,300 to 3,500 a second: holding 2,000 leases of a second (each renewed
every third of it), it fell behind and leases lapsed. The renewals waiting
in a lane's queue, up to ``MAX_BATCH``, now go in one redis-py pipeline
(``transaction=False``: no ``MULTI``, each command its own reply) built by
the client's public ``pipeline()``, so a tracer wrapping ``Pipeline.execute``
sees every command. Each reply is read for its own holding exactly as one
sent alone (``Holding.renewal``): a lease found not ours is lost unless a
release is on its way, an extend that crossed the renewal makes it send the
new lease once more (in one more round trip), and an error, the command's
own or the round trip's, fails that renewal only, for the watchdog to retry
or give up on as it would one sent alone. A script the server lacks
(``NOSCRIPT``: a restart, ``SCRIPT FLUSH``) is loaded and its renewals sent
again, in one more round trip.

Sent alone (``Renewable.renew``): a lane's only renewal waiting, a
``Redlock``'s (it waits on several servers at once) and a Redis Cluster's (a
pipeline there splits by node). A batch has no deadline of its own, as a
renewal sent alone has none: the watchdog reports each renewal still
unanswered at its own lease end, the batch's earliest first.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Generator, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from redis.exceptions import NoScriptError

from django_redislock.backend.client import BACKEND_ERRORS, backend_error

if TYPE_CHECKING:
    from django_redislock.backend.scripts import Script

#: The most renewals one round trip carries.
MAX_BATCH = 256

W = TypeVar("W")
R = TypeVar("R")

#: How a renewal ended: ``True`` renewed (or nothing left to renew), ``False``
#: the lease is no longer ours, or the error that kept it from being renewed.
Outcome = bool | Exception
#: A renewal: its holding, when it was sent, and how it ended.
Result = tuple["Renewable", float, Outcome]


class Renewable(Protocol):
    """What the watchdog needs of a holding; ``name``, ``renew_script``,
    ``renew_call`` and ``renewal`` only of one with a ``batch_client``."""

    lease_deadline: float
    name: str
    renew_script: Script

    @property
    def renew_interval(self) -> float: ...

    @property
    def lane(self) -> Hashable:
        """The connection pool the renewal goes over: leases with the same
        lane are renewed in one thread, in turn or together."""

    @property
    def batch_client(self) -> Any:
        """The client whose pipeline may carry this renewal with others of the
        same client; ``None``: renewed alone."""

    def renew(self) -> bool:
        """Extend the lease one more term, alone; ``False`` if it is no longer ours."""

    def renewal(self) -> Generator[float, bool, bool]:
        """``renew``'s steps: yields each lease to send, takes the answer."""

    def renew_call(self, lease: float) -> tuple[Sequence[str | bytes], list[Any]]: ...

    def mark_lost(self, reason: str) -> None: ...


def take_batch(jobs: deque[tuple[W, R]]) -> tuple[W, list[R]]:
    """From a lane's queue of ``(function, holding)`` jobs: the next one's
    function, with the holdings of the jobs for it waiting right behind, up
    to ``MAX_BATCH`` in all (the function takes them together)."""
    work, first = jobs.popleft()
    taken = [first]
    while jobs and len(taken) < MAX_BATCH and jobs[0][0] == work:
        taken.append(jobs.popleft()[1])
    return work, taken


def renew_all(refs: Iterable[weakref.ref[Renewable]]) -> Iterator[Result]:
    """Renew the holdings still alive of ``refs``: those sharing a
    ``batch_client`` in one pipeline, the others alone, each looked up when
    its turn comes (one dropped while another's renewal waits on Redis is not
    renewed). An error never escapes: it is that renewal's outcome."""
    together: dict[int, list[Renewable]] = {}
    for ref in refs:
        holding = ref()
        if holding is None:
            continue
        client = holding.batch_client
        if client is None:
            yield _alone(holding)
        else:
            together.setdefault(id(client), []).append(holding)
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
    """One client's renewals in one pipeline; then, in one more, those an
    extend crossed (``Holding.renewal`` sends at most twice)."""
    client = holdings[0].batch_client
    started = time.monotonic()
    steps = [holding.renewal() for holding in holdings]
    outcomes: dict[int, Outcome] = {}
    to_send: dict[int, float] = {}
    for index, renewal in enumerate(steps):
        _advance(index, renewal, None, to_send, outcomes)
    while to_send:
        sending, to_send = list(to_send.items()), {}
        replies = _send(client, [(holdings[index], lease) for index, lease in sending])
        for (index, _), reply in zip(sending, replies, strict=True):
            answer = _answer(holdings[index], reply)
            _advance(index, steps[index], answer, to_send, outcomes)
    return [(holding, started, outcomes[index]) for index, holding in enumerate(holdings)]


def _advance(
    index: int,
    renewal: Generator[float, bool, bool],
    answer: bool | Exception | None,
    to_send: dict[int, float],
    outcomes: dict[int, Outcome],
) -> None:
    """Give a renewal's steps the answer to its last send (``None``: start
    them): the next lease it sends goes to ``to_send``, its end to ``outcomes``."""
    try:
        if answer is None:
            to_send[index] = next(renewal)
        elif isinstance(answer, Exception):
            to_send[index] = renewal.throw(answer)
        else:
            to_send[index] = renewal.send(answer)
    except StopIteration as done:
        outcomes[index] = bool(done.value)
    except Exception as exc:
        outcomes[index] = exc


def _answer(holding: Renewable, reply: Any) -> bool | Exception:
    """What a renewal's steps take for its command's reply: whether the lease
    is ours, or the error, a Redis one as ``LockBackendError`` (as sent alone)."""
    if isinstance(reply, BACKEND_ERRORS):
        error = backend_error(holding.name, reply)
        error.__cause__ = reply
        return error
    if isinstance(reply, Exception):
        return reply
    return bool(reply)


def _send(client: Any, calls: list[tuple[Renewable, float]]) -> list[Any]:
    """Each call's reply, or its error; those whose script the server lacked
    are sent again after it, loaded in the same round trip."""
    replies = _execute(client, calls, ())
    missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        scripts = {calls[i][0].renew_script.sha: calls[i][0].renew_script for i in missing}
        again = _execute(client, [calls[i] for i in missing], scripts.values())
        for index, reply in zip(missing, again, strict=True):
            replies[index] = reply
    return replies


def _execute(
    client: Any, calls: list[tuple[Renewable, float]], load: Iterable[Script]
) -> list[Any]:
    """One round trip: ``SCRIPT LOAD`` of ``load``, then the calls. Each
    call's reply or error reply; the round trip's error for each when it
    failed; a call that could not be built (its ``renew_call``) fails alone."""
    out: list[Any] = [None] * len(calls)
    queued: list[int] = []
    loads = 0
    try:
        with client.pipeline(transaction=False) as pipe:
            for script in load:
                pipe.script_load(script.text)
                loads += 1
            for index, (holding, lease) in enumerate(calls):
                try:
                    keys, args = holding.renew_call(lease)
                    holding.renew_script.queue(pipe, keys, args)
                except Exception as exc:
                    out[index] = exc
                else:
                    queued.append(index)
            replies = pipe.execute(raise_on_error=False) if queued else [None] * loads
    except Exception as exc:
        for index in queued:
            out[index] = exc
        return out
    for index, reply in zip(queued, replies[loads:], strict=True):
        out[index] = reply
    return out
