"""The COMMAND of ``manage.py lead``'s tests: fenced writes, its start and stop on record.

Run as ``python -m tests.support.lead_child`` by a runner, with the term's
fencing token in ``REDISLOCK_FENCING_TOKEN``. It writes every few ms through a
fence kept in the store (``LEAD_STORE_URL``, a server other than the
leadership's, so a restart of that one does not reset it), as the fault
suite's fenced writers do: a write with a token below the highest one seen is
refused and recorded as such. Events go to the ``lead:events`` list as JSON:
``start`` (with whether any other child's pid was alive then), ``stop`` (on
SIGTERM), each with pid, token and wall-clock time.

``LEAD_CHILD_WRITES=N``: exit with status ``LEAD_CHILD_EXIT`` after N writes.
``LEAD_CHILD_IGNORE_TERM=1``: ignore SIGTERM (the runner must SIGKILL it).
"""

from __future__ import annotations

import json
import os
import signal
import time

import redis

EVENTS = "lead:events"
ACCEPTED = "lead:accepted"
REFUSED = "lead:refused"
PIDS = "lead:pids"
BOX = "lead:box:"

#: KEYS: fence, accepted, refused. ARGV: token, record. Accept the write only
#: if no higher token wrote before (a fenced write, as the fault suite's).
FENCED_WRITE = """
local top = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < top then
  redis.call('RPUSH', KEYS[3], ARGV[2])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not reaped yet) is not acting
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def main() -> None:
    store = redis.Redis.from_url(
        os.environ["LEAD_STORE_URL"], decode_responses=True, socket_timeout=5
    )
    token = int(os.environ["REDISLOCK_FENCING_TOKEN"])
    pid = os.getpid()
    stopping = []
    if os.environ.get("LEAD_CHILD_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    others = [int(p) for p in store.lrange(PIDS, 0, -1)]
    store.rpush(PIDS, pid)
    overlap = [p for p in others if _alive(p)]

    def event(name: str, **extra: object) -> None:
        record = {"event": name, "pid": pid, "token": token, "t": time.time(), **extra}
        store.rpush(EVENTS, json.dumps(record))
        store.rpush(f"{BOX}{name}", json.dumps(record))  # what a test waits on (BLPOP)

    write = store.register_script(FENCED_WRITE)

    def fenced_write() -> None:
        record = json.dumps({"pid": pid, "token": token, "t": time.time()})
        try:
            if not write(keys=["lead:fence", ACCEPTED, REFUSED], args=[token, record]):
                store.rpush(f"{BOX}refused", record)
        except redis.RedisError:
            pass  # the store is not what the tests break

    fenced_write()  # before "start": a started COMMAND has written (or been refused)
    event("start", alive=overlap)
    writes, limit = 1, int(os.environ.get("LEAD_CHILD_WRITES", "0"))
    while not stopping:
        if limit and writes >= limit:
            event("exit")
            raise SystemExit(int(os.environ.get("LEAD_CHILD_EXIT", "0")))
        time.sleep(0.01)  # the workload's pace, not a synchronisation
        fenced_write()
        writes += 1
    event("stop")


if __name__ == "__main__":
    main()
