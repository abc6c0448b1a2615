"""Redis for the example shop: ``REDIS_URL``, or an embedded fakeredis TCP server."""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keep_alive_handler() -> type:
    """fakeredis's TCP server closes a connection after any error reply, even
    ``NOSCRIPT``, which real Redis answers and then keeps serving; a client
    that loads the script on the same connection then sees it closed. This
    handler goes on serving until the peer has really gone."""
    from fakeredis._clients._tcp_server import TCPFakeRequestHandler

    class KeepAlive(TCPFakeRequestHandler):  # type: ignore[misc]
        def handle(self) -> None:
            while not self.server._shutdown_event.is_set():
                super().handle()
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return  # the peer closed
                except BlockingIOError:
                    continue  # still connected, nothing sent yet
                except OSError:
                    return

    return KeepAlive


def _port() -> int:
    # runserver's autoreloader runs settings in two processes: share one port.
    return int(os.environ.setdefault("SHOP_EMBEDDED_REDIS_PORT", str(_free_port())))


@functools.cache
def _server(port: int) -> Any:
    """The fakeredis server this process serves on ``port``, or ``None`` when
    another process has it (the autoreloader's parent, or a shop given by
    ``SHOP_EMBEDDED_REDIS_PORT``)."""
    try:
        from fakeredis import TcpFakeServer
    except ImportError as exc:  # pragma: no cover - fakeredis is a dev dependency
        raise SystemExit("Set REDIS_URL or pip install 'fakeredis[lua]'.") from exc
    try:
        server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    except OSError:
        return None
    server.daemon_threads = True
    server.RequestHandlerClass = _keep_alive_handler()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def redis_url() -> str:
    """Silent: settings run in every command, and only the ones that serve
    the shop say which Redis it has (``announcement()``)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    port = _port()
    _server(port)
    return f"redis://127.0.0.1:{port}/0"


def announcement() -> str | None:
    """What ``runserver`` says once on start-up: which Redis, and how another
    command reaches the embedded one."""
    if os.environ.get("REDIS_URL"):
        return None
    port = _port()
    if _server(port) is None:
        return (
            f"No REDIS_URL set: the shop uses the embedded fakeredis server at 127.0.0.1:{port} "
            "of another process (SHOP_EMBEDDED_REDIS_PORT)."
        )
    return (
        f"No REDIS_URL set: the shop uses an embedded fakeredis server at 127.0.0.1:{port}, "
        f"inside this runserver (other commands reach it with SHOP_EMBEDDED_REDIS_PORT={port}; "
        "set REDIS_URL=redis://... for a real Redis)."
    )


def started_here() -> bool:
    """Whether this process serves the embedded Redis it uses, which no
    other process (a running shop) then sees."""
    return not os.environ.get("REDIS_URL") and _server(_port()) is not None
