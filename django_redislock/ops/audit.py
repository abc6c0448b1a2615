"""The record an operator's force-release leaves in the logs.

``manage.py locks clear`` and the admin's "Release" both break someone
else's hold: its holder finds out only at its next renewal or release
(``LockLostError``). Each such release logs one record at INFO on the
``django_redislock.audit`` logger, naming the lock, whose hold it was, who
released it and from where, so that "why did my job lose its lock?" has an
answer in the logs. The fields are also attached to the record (``extra``)
for structured handlers.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Sequence

#: Pinned: operators route it by this name (docs/operations.md), wherever the module lives.
logger = logging.getLogger("django_redislock.audit")


def log_force_release(
    name: str, *, kind: str, who: str, where: str, holders: Sequence[str] = ()
) -> None:
    """Log that ``who`` force-released the ``kind`` called ``name`` from ``where``.

    ``holders`` are the holders whose hold was broken (``host:pid:thread`` as
    they described themselves), when known.
    """
    logger.info(
        "Force-released %s %r held by %s; released by %s from %s.",
        kind,
        name,
        ", ".join(holders) or "nobody known",
        who,
        where,
        extra={
            "lock_name": name,
            "lock_kind": kind,
            "lock_holders": list(holders),
            "released_by": who,
            "released_from": where,
        },
    )


def os_user() -> str:
    """The operating-system user running this process, and the one behind ``sudo``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (containers)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    sudo_user = os.environ.get("SUDO_USER")
    return f"{sudo_user} (as {user} via sudo)" if sudo_user and sudo_user != user else user


def this_process(what: str) -> str:
    """``host pid N (what)``: where a release came from."""
    return f"{socket.gethostname()} pid {os.getpid()} ({what})"
