"""Redis for the example shop: ``REDIS_URL``, or an embedded fakeredis TCP server."""

from __future__ import annotations

import os
import socket
import sys
import threading


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


def redis_url() -> str:
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    # runserver's autoreloader runs settings in two processes: share one port.
    port = int(os.environ.setdefault("SHOP_EMBEDDED_REDIS_PORT", str(_free_port())))
    try:
        from fakeredis import TcpFakeServer
    except ImportError as exc:  # pragma: no cover - fakeredis is a dev dependency
        raise SystemExit("Set REDIS_URL or pip install 'fakeredis[lua]'.") from exc
    try:
        server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    except OSError:
        return f"redis://127.0.0.1:{port}/0"  # the other autoreload process has it
    server.daemon_threads = True
    server.RequestHandlerClass = _keep_alive_handler()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(
        f"No REDIS_URL set: using an embedded fakeredis server at 127.0.0.1:{port} "
        "(single process only; set REDIS_URL=redis://... for real Redis).",
        file=sys.stderr,
    )
    return f"redis://127.0.0.1:{port}/0"
