"""Redis for the example shop: ``REDIS_URL``, or an embedded fakeredis TCP server.

The embedded server lives inside one process (the shop's ``runserver``), so it
is shared, never copied:

- the process that starts it publishes its address in a file beside the
  shop's database (``<database>.redis``: ``pid port``) and holds an exclusive
  ``flock`` on that file for as long as it lives, so the kernel, not a stale
  pid, says whether it still runs;
- any other process of the same project (``manage.py locks``, ``shop_load``,
  a second ``runserver``) finds that file locked and uses the running
  server, instead of starting an empty one of its own that nobody else sees;
- a worker of a multi-process server (gunicorn, uvicorn, ...) refuses to
  start without ``REDIS_URL``: each worker would have a server of its own
  (locks not shared between them), or depend on one that dies with a worker.

``SHOP_EMBEDDED_REDIS_PORT`` names the port explicitly (and carries it to
runserver's autoreloader child).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

try:
    import fcntl
except ImportError:  # Windows: no flock, so no sharing; commands need the port given
    fcntl = None  # type: ignore[assignment]

#: Servers whose workers are separate processes: their presence in
#: ``sys.modules`` means this process is (or will fork) one of them.
MULTI_PROCESS_SERVERS = ("gunicorn", "uvicorn", "hypercorn", "daphne", "uwsgi")


def database_path() -> Path:
    """The shop's SQLite file (``SHOP_DATABASE``), which the address file sits beside."""
    default = Path(__file__).resolve().parent / "db.sqlite3"
    return Path(os.environ.get("SHOP_DATABASE") or default)


def address_file() -> Path:
    return Path(f"{database_path()}.redis")


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


def running_elsewhere() -> tuple[int, int] | None:
    """``(pid, port)`` of the embedded server another live process of this
    project publishes, else ``None`` (no file, or nobody holds its lock)."""
    if fcntl is None:
        return None
    path = address_file()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: its publisher is alive
            pid, port = os.read(fd, 64).decode().split()
            return int(pid), int(port)
        fcntl.flock(fd, fcntl.LOCK_UN)  # nobody holds it: a stale file
        return None
    except ValueError:  # being written right now, or not ours
        return None
    finally:
        os.close(fd)


@functools.cache
def _found() -> tuple[int, int] | None:
    """The running server this process found when it first looked (see ``_port``)."""
    return running_elsewhere()


def _port() -> int:
    explicit = os.environ.get("SHOP_EMBEDDED_REDIS_PORT")
    if explicit:
        return int(explicit)
    found = _found()
    port = found[1] if found else _free_port()
    # runserver's autoreloader runs settings in two processes: share one port
    os.environ["SHOP_EMBEDDED_REDIS_PORT"] = str(port)
    return port


def _publish(port: int) -> int | None:
    """Write ``pid port`` to the address file under an exclusive lock, kept
    (the descriptor stays open) until this process ends."""
    if fcntl is None:
        return None
    path = address_file()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None  # a read-only checkout: other commands need the port given
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another process published first
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {port}\n".encode())
    return fd


@functools.cache
def _server(port: int) -> Any:
    """The fakeredis server this process serves on ``port``, or ``None`` when
    another process has it (the autoreloader's parent, a running shop, or a
    shop given by ``SHOP_EMBEDDED_REDIS_PORT``)."""
    try:
        from fakeredis import TcpFakeServer
    except ImportError as exc:  # pragma: no cover - fakeredis is in the shop extra
        raise SystemExit("Set REDIS_URL or pip install 'fakeredis[lua]'.") from exc
    try:
        server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    except OSError:
        return None
    server.daemon_threads = True
    server.RequestHandlerClass = _keep_alive_handler()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.published_fd = _publish(port)
    return server


def multi_process_server() -> str | None:
    """The multi-process server this process runs under, if any."""
    return next((name for name in MULTI_PROCESS_SERVERS if name in sys.modules), None)


def redis_url() -> str:
    """Silent: settings run in every command, and only the ones that serve
    the shop say which Redis it has (``announcement()``)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    server = multi_process_server()
    if server is not None:
        raise ImproperlyConfigured(
            f"The example shop has no REDIS_URL and runs under {server}: its embedded "
            "fakeredis server lives inside one process, so workers would not share "
            "their locks. Set REDIS_URL=redis://HOST:6379/0 to a Redis all workers "
            "share (docs/example.md, 'Under gunicorn or uvicorn')."
        )
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
        found = _found()
        owner = f"process {found[0]}" if found else "another process"
        return (
            f"No REDIS_URL set: the shop uses the embedded fakeredis server at 127.0.0.1:{port} "
            f"of {owner}; it goes when that process ends."
        )
    return (
        f"No REDIS_URL set: the shop uses an embedded fakeredis server at 127.0.0.1:{port}, "
        f"inside this runserver; other commands of this project (manage.py locks, "
        f"shop_load) find it through {address_file().name}, or with "
        f"SHOP_EMBEDDED_REDIS_PORT={port}. Set REDIS_URL=redis://... for a real Redis."
    )


def started_here() -> bool:
    """Whether this process serves the embedded Redis it uses, which no
    other process (a running shop) then sees."""
    return not os.environ.get("REDIS_URL") and _server(_port()) is not None


def describe() -> str:
    """One line for a command that inspects this Redis: whose server it is."""
    if os.environ.get("REDIS_URL"):
        return f"Redis: {os.environ['REDIS_URL']} (REDIS_URL)."
    port = _port()
    if _server(port) is not None:
        return (
            f"No REDIS_URL set and no running shop found ({address_file()}): this is an "
            f"empty embedded fakeredis server of this command's own at 127.0.0.1:{port}, "
            "not the shop's. Start the shop first (bash scripts/shop), or set REDIS_URL."
        )
    found = _found()
    owner = f" (the running shop, pid {found[0]})" if found else ""
    return f"Redis: the embedded fakeredis server at 127.0.0.1:{port}{owner}."
