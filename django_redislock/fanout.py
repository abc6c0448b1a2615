"""One script on several independent servers at once, for ``Redlock``.

The request is written to every server before any reply is read, so N
servers cost about one round trip, without threads; connections come from
the pools' public ``get_connection``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
import redis.connection
from redis.exceptions import NoScriptError

from .backend import BACKEND_ERRORS

if TYPE_CHECKING:
    from .scripts import Script


def run_on_all(
    clients: list[Any],
    script: Script,
    keys: Sequence[str | bytes],
    args: list[Any],
    *,
    timeout: float | None,
) -> list[Any]:
    """Run ``script`` on every client concurrently; one result or exception each.

    The request is written to every server before any reply is read, so N
    servers cost about one round trip, without threads. A reply that has not
    arrived ``timeout`` seconds after the requests were sent counts as a
    ``redis.TimeoutError`` (its connection is dropped, so a late reply can never
    be read as the answer to a later command). Clients without a plain
    connection pool (Sentinel, Cluster) are called one after the other.
    """
    results: list[Any] = [None] * len(clients)
    pending: list[tuple[int, Any, Any, Any]] = []
    for index, client in enumerate(clients):
        pool = getattr(client, "connection_pool", None)
        if type(pool) is not redis.connection.ConnectionPool:
            results[index] = _run_one(client, script, keys, args)
            continue
        try:
            conn: Any = _pool_connection(pool)
        except BACKEND_ERRORS as exc:
            results[index] = exc
            continue
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except BACKEND_ERRORS as exc:
            conn.disconnect()
            pool.release(conn)
            results[index] = exc
            continue
        pending.append((index, client, pool, conn))
    sent = time.monotonic()
    for index, client, pool, conn in pending:
        # A stalled server may cost at most its own socket timeout, never the
        # whole ``timeout``: the healthy majority's answers are still in time.
        limit = _reply_limit(timeout, pool.connection_kwargs.get("socket_timeout"))
        retry = False
        try:
            if limit is not None and not conn.can_read(
                timeout=max(0.0, sent + limit - time.monotonic())
            ):
                raise redis.TimeoutError(f"no reply within {limit:.3f}s")
            results[index] = conn.read_response()
        except NoScriptError:
            retry = True
        except BACKEND_ERRORS as exc:
            conn.disconnect()
            results[index] = exc
        finally:
            pool.release(conn)
        if retry:  # first use of the script on this server
            results[index] = _run_one(client, script, keys, args)
    return results


def _reply_limit(timeout: float | None, socket_timeout: float | None) -> float | None:
    limits = [t for t in (timeout, socket_timeout) if t]
    return min(limits) if limits else None


def _pool_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 requires a command name
        return pool.get_connection("EVALSHA")


def _run_one(client: Any, script: Script, keys: Sequence[str | bytes], args: list[Any]) -> Any:
    try:
        return script(client, keys, args)
    except BACKEND_ERRORS as exc:
        return exc
