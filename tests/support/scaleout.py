"""Multi-node Redis for the scale-out tests: a Cluster, a Sentinel group, Redlock servers.

Every process is a real ``redis-server`` on a free loopback port (never 6379),
started by the fixtures below and stopped when they end, even on failure.
The fixtures are a pytest plugin (``conftest.py`` lists this module in
``pytest_plugins``), so any test module can ask for them:

- ``redis_cluster`` (session): three primaries, slots assigned here with
  ``CLUSTER ADDSLOTSRANGE`` and joined with ``CLUSTER MEET``; flushed per test
  by ``cluster_settings``.
- ``cluster_settings``: points the ``default`` cache (and so every primitive)
  at that cluster through ``django_redislock.cluster.ClusterClient``.
- ``topology``: parametrizes a test over ``single`` and ``cluster``.
- ``sentinel_group``: a primary, a replica and three sentinels with short
  failure-detection times, for failover tests.
- ``redlock_servers`` (module): five independent servers and cache aliases
  ``redlock0``..``redlock4`` named in ``REDISLOCK["REDLOCK"]``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings

from tests.settings import redis_cache
from tests.support.servers import REDIS_SERVER, RedisServer, free_port, wait_for_ping

CLUSTER_SLOTS = 16384
SENTINEL_SERVICE = "mymaster"


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until it is true: for server state that announces nothing."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _require_binary() -> None:
    if REDIS_SERVER is None:
        pytest.skip("needs a redis-server binary")


# --- Redis Cluster ---------------------------------------------------------------------


class RedisClusterNodes:
    """``count`` cluster-enabled primaries sharing all 16384 slots."""

    def __init__(self, count: int = 3) -> None:
        self.bus_ports = [free_port() for _ in range(count)]
        self.servers = [
            RedisServer(
                args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000",
                    # The bus port defaults to port + 10000, which may be taken or > 65535.
                    "--cluster-port", str(bus_port),
                ]
            )
            for bus_port in self.bus_ports
        ]  # fmt: skip

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> RedisClusterNodes:
        try:
            for server in self.servers:
                server.start()
            clients = [server.client() for server in self.servers]
            share = CLUSTER_SLOTS // len(clients)
            for index, client in enumerate(clients):
                first = index * share
                last = CLUSTER_SLOTS - 1 if index == len(clients) - 1 else first + share - 1
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for server, bus_port in zip(self.servers[1:], self.bus_ports[1:], strict=True):
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus_port)

            def ready() -> bool:
                for client in clients:
                    info = client.cluster("info")
                    if info.get("cluster_state") != "ok":
                        return False
                    if int(info.get("cluster_known_nodes", 0)) != len(clients):
                        return False
                return True

            wait_until(ready, "cluster_state:ok on every node")
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def cluster_client(self) -> redis.cluster.RedisCluster:
        nodes = [redis.cluster.ClusterNode("127.0.0.1", s.port) for s in self.servers]
        return redis.cluster.RedisCluster(startup_nodes=nodes)

    def flush(self) -> None:
        for server in self.servers:
            client = server.client()
            client.flushall()
            client.close()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def cluster_cache(urls: list[str], **options: object) -> dict[str, object]:
    """A CACHES entry for a Redis Cluster through ``ClusterClient``."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": urls,
        "OPTIONS": {"CLIENT_CLASS": "django_redislock.cluster.ClusterClient", **options},
    }


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterNodes]:
    _require_binary()
    nodes = RedisClusterNodes().start()
    yield nodes
    nodes.stop()


@pytest.fixture
def cluster_settings(redis_cluster: RedisClusterNodes) -> Iterator[RedisClusterNodes]:
    """Run the test with the ``default`` cache (and so every primitive) on the cluster.

    Any primitive test can be parametrized onto the cluster by requesting this
    fixture; the cluster is flushed before the test.
    """
    redis_cluster.flush()
    caches = {
        "default": cluster_cache(redis_cluster.urls),
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches):
        yield redis_cluster


@pytest.fixture(params=["single", "cluster"])
def topology(request: pytest.FixtureRequest) -> str:
    """Run a test twice: on the session's single server, then on the cluster.

    Add it to any primitive test's arguments (``def test_x(topology): ...``);
    the cluster run is marked ``scaleout`` by ``pytest_collection_modifyitems``.
    """
    if request.param == "cluster":
        request.getfixturevalue("cluster_settings")
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("topology") == "cluster":
            item.add_marker(pytest.mark.scaleout)


# --- Sentinel ------------------------------------------------------------------------------


class SentinelProcess:
    """One ``redis-server --sentinel`` watching ``SENTINEL_SERVICE``."""

    def __init__(self, primary_port: int, *, down_after_ms: int, failover_timeout_ms: int) -> None:
        assert REDIS_SERVER is not None
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"redislock-sentinel-{self.port}-"))
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "protected-mode no\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after_ms}\n"
            f"sentinel failover-timeout {SENTINEL_SERVICE} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelProcess:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [REDIS_SERVER, str(self.conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_ping(f"redis://127.0.0.1:{self.port}/0")
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelGroup:
    """A primary, one replica and three sentinels that fail over within seconds."""

    def __init__(self, *, down_after_ms: int = 400, failover_timeout_ms: int = 2000) -> None:
        self.primary = RedisServer()
        self.replica: RedisServer | None = None
        self.sentinels: list[SentinelProcess] = []
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def start(self) -> SentinelGroup:
        try:
            self.primary.start()
            self.replica = RedisServer(
                args=["--replicaof", "127.0.0.1", str(self.primary.port)]
            ).start()
            replica_client = self.replica.client()
            wait_until(
                lambda: replica_client.info("replication").get("master_link_status") == "up",
                "the replica to sync",
            )
            replica_client.close()
            for _ in range(3):
                self.sentinels.append(
                    SentinelProcess(
                        self.primary.port,
                        down_after_ms=self.down_after_ms,
                        failover_timeout_ms=self.failover_timeout_ms,
                    ).start()
                )

            def discovered() -> bool:
                for sentinel in self.sentinels:
                    with sentinel.client() as client:
                        info = client.sentinel_master(SENTINEL_SERVICE)
                        if int(info["num-other-sentinels"]) != 2 or int(info["num-slaves"]) != 1:
                            return False
                return True

            wait_until(discovered, "the sentinels to find each other and the replica")
        except BaseException:
            self.stop()
            raise
        return self

    def primary_port(self) -> int:
        with self.sentinels[0].client() as client:
            _, port = client.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE
            )
        return int(port)

    def cache(self, **options: Any) -> dict[str, object]:
        """A CACHES entry using django-redis's SentinelClient on this group."""
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SENTINEL_SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": self.addresses,
                **options,
            },
        }

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        if self.replica is not None:
            self.replica.stop()
        self.primary.stop()


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    _require_binary()
    group = SentinelGroup().start()
    yield group
    group.stop()
    # django-redis keeps one pool per LOCATION per process, bound to these
    # sentinels: forget it, or the next group's test would ask the dead ones.
    from django_redis.pool import ConnectionFactory

    for url in [
        u for u in ConnectionFactory._pools if u.startswith(f"redis://{SENTINEL_SERVICE}/")
    ]:
        ConnectionFactory._pools.pop(url).disconnect()


# --- Redlock ------------------------------------------------------------------------------

REDLOCK_ALIASES = [f"redlock{i}" for i in range(5)]


class RedlockServers:
    """Five independent servers; tests stop and start them, the fixture restores them."""

    def __init__(self, count: int = 5) -> None:
        self.servers = [RedisServer() for _ in range(count)]

    def start(self) -> RedlockServers:
        try:
            for server in self.servers:
                server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def caches(self, **options: object) -> dict[str, object]:
        return {
            alias: redis_cache(server.url, **options)
            for alias, server in zip(REDLOCK_ALIASES, self.servers, strict=True)
        }

    def ensure_running(self) -> None:
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                server.restart()  # closes the dead process's pipe before a new one

    def flush(self) -> None:
        for server in self.servers:
            with server.client() as client:
                client.flushall()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def _redlock_servers() -> Iterator[RedlockServers]:
    _require_binary()
    servers = RedlockServers().start()
    yield servers
    servers.stop()


@pytest.fixture
def redlock_servers(_redlock_servers: RedlockServers) -> Iterator[RedlockServers]:
    """Five running, empty servers, named in ``REDISLOCK["REDLOCK"]`` for this test."""
    from django.conf import settings

    _redlock_servers.ensure_running()
    _redlock_servers.flush()
    caches = {**settings.CACHES, **_redlock_servers.caches(SOCKET_TIMEOUT=1.0)}
    with override_settings(CACHES=caches, REDISLOCK={"REDLOCK": REDLOCK_ALIASES}):
        yield _redlock_servers
    _redlock_servers.ensure_running()
