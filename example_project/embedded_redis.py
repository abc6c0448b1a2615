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
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(
        f"No REDIS_URL set: using an embedded fakeredis server at 127.0.0.1:{port} "
        "(single process only; set REDIS_URL=redis://... for real Redis).",
        file=sys.stderr,
    )
    return f"redis://127.0.0.1:{port}/0"
