"""A small TCP proxy for fault injection: latency, cut connections, black holes.

It sits between a client and a Redis server on loopback, runs an asyncio loop
in a daemon thread, and is a context manager that always closes every socket
and stops its thread::

    with FaultProxy(redis_url) as proxy:
        use(proxy.url)          # a redis:// URL that goes through the proxy
        proxy.latency = 1.0     # every chunk, both ways, is delayed one second
        proxy.blackhole()       # accept and read, never forward, never answer
        proxy.heal()            # forward again (new and open connections)
        proxy.cut()             # close every open connection now
        proxy.drop_replies(1)   # the next answer from Redis is lost: cut, not forwarded

Only loopback addresses are accepted, so a test can never aim it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")

_CHUNK = 65536


def _loopback(host: str) -> str:
    address = socket.gethostbyname(host)
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"FaultProxy only proxies loopback addresses, not {host!r}.")
    return address


class FaultProxy:
    """Forward a loopback listening port to ``target`` (a redis:// URL or host:port)."""

    def __init__(self, target: str) -> None:
        if "://" in target:
            parsed = urlparse(target)
            host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
            self._db = parsed.path.lstrip("/") or "0"
        else:
            host, _, port_text = target.rpartition(":")
            port = int(port_text)
            self._db = "0"
        self.target = (_loopback(host), port)
        self.port = 0
        #: Seconds every forwarded chunk waits before it is passed on.
        self.latency = 0.0
        self._blackholed = False
        self._drop_replies = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        #: Connections accepted so far (a test can check its client went through us).
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{self._db}"

    # lifecycle ------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        try:
            self._server = self._call(self._listen())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._shutdown(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # faults ---------------------------------------------------------------------

    def blackhole(self) -> None:
        """From now on, read everything and forward nothing, on every connection."""
        self._call(self._set(blackholed=True))

    def heal(self) -> None:
        """Forward again and drop any latency."""
        self._call(self._set(blackholed=False, latency=0.0))

    def drop_replies(self, count: int = 1) -> None:
        """Lose the next ``count`` answers from the server: each is swallowed and
        its connection cut, after the server ran the command (a reply lost on
        the way back)."""
        self._call(self._set(drop_replies=count))

    def cut(self) -> None:
        """Close every open connection at once; new connections are still accepted."""
        self._call(self._close_all())

    def open_connections(self) -> int:
        return len(self._writers) // 2

    # the loop side -----------------------------------------------------------------

    def _call(self, coro: Awaitable[T], timeout: float = 10) -> T:
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self._loop)
        return future.result(timeout)

    async def _set(self, **state: Any) -> None:
        if "blackholed" in state:
            self._blackholed = state["blackholed"]
        if "latency" in state:
            self.latency = state["latency"]
        if "drop_replies" in state:
            self._drop_replies = state["drop_replies"]

    async def _listen(self) -> asyncio.Server:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        pipes = [
            self._spawn(self._pipe(reader, up_writer)),
            self._spawn(self._pipe(up_reader, writer, answers=True)),
        ]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for task in pipes:
            task.cancel()
        for w in (writer, up_writer):
            self._close(w)

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task = self._loop.create_task(_as_coroutine(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool = False
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                if answers and self._drop_replies > 0:
                    self._drop_replies -= 1
                    return  # the caller closes both sides: the answer never arrives
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                if self._blackholed:
                    continue  # swallowed: the sender waits for an answer that never comes
                writer.write(data)
                await writer.drain()

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        transport = writer.transport
        with contextlib.suppress(Exception):
            transport.abort()  # RST, like a broken network path, not a polite FIN

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            self._close(writer)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable
