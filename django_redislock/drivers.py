"""Thin drivers that run a protocol (``protocol.py``) on a client.

``run`` does the steps with a synchronous redis-py client, ``run_async`` on
asyncio through an ``AsyncConnection`` (natively, or in a worker thread where
the topology has no asyncio client). Both send each step's reply back into
the protocol, or throw the step's exception into it, so clean-up and error
translation live in the protocol, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypeVar

from . import async_clients, backend
from .protocol import Call, Step

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .scripts import Script

T = TypeVar("T")


def _cancel_requests() -> int:
    """How many cancellations of the current task are pending (0 before Python 3.11)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


class AsyncConnection:
    """Run scripts and commands on asyncio, natively or in a worker thread."""

    def __init__(self, sync_client: Any) -> None:
        self.sync = sync_client
        self.aio = async_clients.get_async_client(sync_client)
        self._cancels_before = _cancel_requests()

    async def run(self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        if self.aio is not None:
            return await script.run_async(self.aio, keys, args)
        return await asyncio.to_thread(script, self.sync, keys, args)

    async def wait_signal(self, key: str | bytes, timeout: float) -> tuple[bytes, bytes] | None:
        """``BLPOP`` one waiter's signal list: ``(key, value)``, or ``None`` in time.

        redis.asyncio writes each command under ``asyncio.wait_for``, which
        before Python 3.12 returns normally when the task is cancelled just as
        the write completes (CPython gh-86296): a waiter would then carry on
        waiting until its ``blocking_timeout``. Python 3.11 still counts the
        request (``Task.cancelling``, compared with its count when this
        connection was made), so it is honoured here after the wait; on
        Python 3.10 the lost cancellation cannot be seen.
        """
        signal = await self.call("blpop", [key], timeout=timeout)
        if _cancel_requests() > self._cancels_before:
            raise asyncio.CancelledError
        return None if signal is None else (signal[0], signal[1])

    async def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if self.aio is not None:
            return await getattr(self.aio, command)(*args, **kwargs)
        return await asyncio.to_thread(getattr(self.sync, command), *args, **kwargs)


def run(steps: Generator[Step, Any, T], client: Any) -> T:
    """Run ``steps`` on a synchronous redis-py client."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            if isinstance(step, Call):
                reply = step.script(client, step.keys, step.args)
            else:
                reply = backend.blpop(client, step.key, step.timeout)
        except BaseException as exc:
            reply, error = None, exc


async def run_async(steps: Generator[Step, Any, T], conn: AsyncConnection) -> T:
    """Run ``steps`` on asyncio; a clean-up step runs even while being cancelled."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            if isinstance(step, Call):
                run = conn.run(step.script, step.keys, step.args)
                reply = await (asyncio.shield(run) if step.shield else run)
            else:
                reply = await conn.wait_signal(step.key, step.timeout)
        except BaseException as exc:
            reply, error = None, exc
