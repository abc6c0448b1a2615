from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any
from unittest import mock

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_redislock import Lock, LockLostError
from django_redislock import signals as lock_signals
from django_redislock.ops import inspection
from django_redislock.ops.inspection import HeldInfo, HolderInfo
from tests.support import lockfill


def run(*args: str, stdin: str | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    if stdin is None:
        call_command("locks", *args, stdout=out, stderr=err)
    else:
        with mock.patch("builtins.input", return_value=stdin):
            call_command("locks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def listed(*args: str) -> list[dict[str, Any]]:
    out, _ = run("list", "--json", *args)
    data: list[dict[str, Any]] = json.loads(out)
    return data


def test_nothing_held() -> None:
    assert run()[0].strip() == "Nothing is held."
    assert listed() == []


def test_table_is_sorted_aligned_and_without_prefix() -> None:
    with Lock("zeta") as zeta, Lock("alpha:1"), Lock("a{b}*c"):
        fence = zeta.fencing_token
        out, _ = run()
        lines = out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "HOLDERS", "TTL", "FENCING", "TOKEN", "WAITERS"]
    assert [line.split()[0] for line in lines[1:4]] == ["alpha:1", "a{b}*c", "zeta"]
    assert lines[4] == "3 held."
    # aligned: every column starts at the same offset on every row
    kind_column = lines[0].index("KIND")
    assert all(line[kind_column : kind_column + 4] == "lock" for line in lines[1:4])
    assert str(fence) in lines[3]
    assert "redislock" not in out


def test_json_is_stable_and_names_are_as_written() -> None:
    with Lock("sku:1") as lock, Lock("a{b}%c"):
        fence = lock.fencing_token
        data = listed()
    assert [d["name"] for d in data] == ["a{b}%c", "sku:1"]
    entry = data[1]
    assert sorted(entry) == [
        "fencing_token", "holders", "kind", "limit", "name", "ttl", "waiters",
    ]  # fmt: skip
    assert entry["kind"] == "lock"
    assert entry["fencing_token"] == fence
    assert 0 < entry["ttl"] <= 30
    holder = entry["holders"][0]
    assert holder["holder"].split(":")[1] == str(os.getpid())
    assert len(holder["token"]) == 8  # never the whole token


def test_pattern_and_kind_filters() -> None:
    with Lock("sku:1"), Lock("sku:2"), Lock("cron:daily"):
        assert [d["name"] for d in listed("--pattern", "sku:*")] == ["sku:1", "sku:2"]
        assert [d["name"] for d in listed("--pattern", "sku:[!1]")] == ["sku:2"]
        assert len(listed("--kind", "lock")) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("list", "--pattern", "sku:[1"), "Bad pattern"),
        (("list", "--pattern", ""), "Bad pattern"),
        (("list", "--kind", "mutex"), "Unknown kind(s) mutex"),
        (("inspect", "a\x00b"), "Bad name"),
        (("clear", "--noinput"), "exactly one"),
        (("clear", "x", "--all", "--noinput"), "exactly one"),
    ],
)
def test_bad_input_is_one_line_command_error(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_inspect_shows_holder_waiters_and_counters() -> None:
    with Lock("report") as lock:
        fence = lock.fencing_token
        out, _ = run("inspect", "report")
        data = json.loads(run("inspect", "report", "--json")[0])
    assert "lock: 1 holder(s), 0 waiter(s)" in out
    assert f"fencing_token={fence}" in out
    assert data["held"][0]["fencing_token"] == fence
    assert "Not held." in run("inspect", "nobody")[0]


def test_inspect_says_semaphores_and_rwlocks_keep_no_counters() -> None:
    from django_redislock import ReadWriteLock, Semaphore

    with Semaphore("exports", 2), ReadWriteLock("exports").read():
        out, _ = run("inspect", "exports")
    assert "counters: none (kept for locks only, not for rwlocks and semaphores)" in out
    with Lock("counted"):
        pass
    with Lock("counted"), Semaphore("counted", 1):
        out, _ = run("inspect", "counted")
    assert "counters: acquired=2" in out


def test_clear_literal_name_with_glob_characters(redis_client: redis.Redis) -> None:
    star, other = Lock("a*", auto_renew=False), Lock("abc", auto_renew=False)
    star.acquire()
    other.acquire()
    out, _ = run("clear", "a*", "--noinput")
    assert "Released lock a*" in out
    assert "Released 1 of 1." in out
    assert other.owned()
    assert [d["name"] for d in listed()] == ["abc"]
    with pytest.raises(LockLostError):
        star.release()
    other.release()


def test_clear_noinput_says_it_is_releasing_not_asking() -> None:
    lock = Lock("gone", auto_renew=False)
    lock.acquire()
    out, _ = run("clear", "gone", "--noinput")
    assert "Releasing 1 held primitive(s):" in out
    assert "This will release" not in out
    assert not lock.owned()


def test_clear_asks_for_confirmation() -> None:
    lock = Lock("keep", auto_renew=False)
    lock.acquire()
    out, _ = run("clear", "keep", stdin="no")
    assert "This will release 1 held primitive(s):" in out
    assert "lock keep" in out
    assert "Cancelled." in out
    assert lock.owned()
    out, err = run("clear", "keep", stdin="yes")
    assert "Released lock keep" in out
    assert err == ""  # not also "Not held any more" (found by a review)
    assert not lock.owned()


def test_clear_says_which_listed_names_were_freed_while_the_operator_read() -> None:
    gone, kept = Lock("freed", auto_renew=False), Lock("stays", auto_renew=False)
    assert gone.acquire() and kept.acquire()

    def free_one_then_answer(prompt: str = "") -> str:
        gone.release()
        return "yes"

    out, err = io.StringIO(), io.StringIO()
    with mock.patch("builtins.input", free_one_then_answer):
        call_command("locks", "clear", "freed", "stays", stdout=out, stderr=err)
    assert err.getvalue().splitlines() == ["Not held any more: freed"]
    assert "Released lock stays" in out.getvalue()
    assert not kept.owned()


def test_clear_leaves_a_name_that_changed_hands_while_the_operator_read(
    other_thread: Any,
) -> None:
    """The holder listed let go while the question was on screen and another
    took the name: that one was never shown, so it is not cleared (found by a
    review of the admin's same race)."""
    first, second = Lock("listed", auto_renew=False), Lock("listed", auto_renew=False)
    assert first.acquire()
    kept = Lock("unchanged", auto_renew=False)
    assert kept.acquire()

    def hand_over_then_answer(prompt: str = "") -> str:
        first.release()
        assert other_thread(second.acquire)
        return "yes"

    out, err = io.StringIO(), io.StringIO()
    with mock.patch("builtins.input", hand_over_then_answer):
        call_command("locks", "clear", "listed", "unchanged", stdout=out, stderr=err)
    assert "Not cleared, changed hands since listed: listed" in err.getvalue()
    assert "Released lock unchanged" in out.getvalue()
    assert other_thread(second.owned)
    assert not kept.owned()
    other_thread(second.release)


def test_clear_pattern_and_all() -> None:
    locks = [Lock(n, auto_renew=False) for n in ("job:1", "job:2", "other")]
    for lock in locks:
        lock.acquire()
    run("clear", "--pattern", "job:*", "--noinput")
    assert [d["name"] for d in listed()] == ["other"]
    run("clear", "--all", "--noinput")
    assert listed() == []
    assert "Nothing to clear." in run("clear", "--all", "--noinput")[0]
    assert "Not held: ghost" in run("clear", "ghost", "--noinput")[1]


def test_cleared_holder_learns_through_its_watchdog() -> None:
    lost = threading.Event()

    def on_lost(**kwargs: object) -> None:
        if kwargs["name"] == "stuck":
            lost.set()

    lock_signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLostError):
            with Lock("stuck", timeout=0.6, auto_renew=True):
                run("clear", "stuck", "--noinput")
                assert lost.wait(5), "the watchdog did not report the cleared lease"
    finally:
        lock_signals.lock_lost.disconnect(on_lost)


def test_clear_wakes_the_next_waiter() -> None:
    holder = Lock("queue", auto_renew=False)
    holder.acquire()
    queued, got = threading.Event(), threading.Event()

    def wait() -> None:
        with mock.patch("django_redislock.engine.steps.wait_seconds", side_effect=lambda *a: 30.0):
            queued.set()
            waiter = Lock("queue", blocking_timeout=60)
            if waiter.acquire():
                got.set()
                waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    queued.wait(5)
    client = redis.Redis.from_url(os.environ["REDISLOCK_TEST_REDIS_URL"])
    deadline = time.monotonic() + 10
    while not client.exists("redislock:{queue}:queue"):  # the waiter has queued
        assert time.monotonic() < deadline, "the waiter never queued"
        threading.Event().wait(0.01)
    run("clear", "queue", "--noinput")
    # the waiter blocks up to 30 s per wait: only the clear's wake-up gets it in time
    assert got.wait(10)
    thread.join(10)


def test_clear_many_shows_progress(redis_client: redis.Redis) -> None:
    lockfill.fill(redis_client, 1200)
    out, err = run("clear", "--all", "--noinput")
    assert "Cleared 500/1200" in err
    assert "Cleared 1200/1200" in err
    assert "… and 1150 more" in out
    assert "Released 1200 of 1200." in out
    # everything cleared; the per-minute history (one key for all names) may
    # have been written meanwhile by the process's recorder
    assert [k for k in redis_client.scan_iter() if b"{~hot}" not in k] == []


def test_listing_uses_scan_never_keys(redis_client: redis.Redis) -> None:
    lockfill.fill(redis_client, 50)
    redis_client.config_resetstat()
    assert len(listed()) == 50
    stats = redis_client.info("commandstats")
    assert "cmdstat_scan" in stats
    assert "cmdstat_keys" not in stats


def test_unreachable_redis_is_one_line_error() -> None:
    from tests.settings import redis_cache
    from tests.support.servers import free_port

    caches = {"default": redis_cache(f"redis://127.0.0.1:{free_port()}/0")}
    with override_settings(CACHES=caches), pytest.raises(CommandError) as info:
        run("list")
    assert str(info.value).startswith("Redis is unreachable or failed: ConnectionError")
    assert "\n" not in str(info.value)


def test_unreachable_redis_from_the_shell_exits_1_without_traceback() -> None:
    from tests.support.servers import free_port

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDISLOCK_TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "django", "locks", "list", "--pattern", "x*"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("CommandError: Redis is unreachable")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cluster_path_pipelines_per_name(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Redis Cluster one command cannot span slots: one name per command."""

    monkeypatch.setattr("django_redislock.backend.client.is_cluster", lambda client: True)
    lockfill.fill(redis_client, 120)
    lock = Lock("zz", auto_renew=False, fencing=True)
    lock.acquire()
    data = listed()
    assert len(data) == 121
    assert data[-1]["fencing_token"] == lock.fencing_token
    redis_client.config_resetstat()
    run("clear", "--all", "--noinput")
    assert redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 121
    with pytest.raises(LockLostError):
        lock.release()
    assert listed() == []


def test_unknown_cache_alias_is_one_line_error() -> None:
    with pytest.raises(CommandError) as info:
        run("--using", "nope", "list")
    assert "cache alias 'nope' is not defined in CACHES" in str(info.value)


class FakeSemaphoreKind:
    """A kind shaped like the semaphore's: several holders, a limit, modes."""

    kind = "semaphore"
    main_part = "fakesem"

    def __init__(self) -> None:
        self.cleared: list[str] = []

    def describe(self, client: Any, prefix: str, name: str) -> HeldInfo | None:
        if not client.exists(f"{prefix}:{{{name}}}:fakesem"):
            return None
        holders = [
            HolderInfo(token="a" * 32, holder="web-1:1:T", ttl=12.5, fencing_token=7),
            HolderInfo(token="b" * 32, holder="web-2:2:T", ttl=3.0, fencing_token=9, mode="read"),
        ]
        return HeldInfo(name=name, kind=self.kind, holders=holders, limit=5, waiters=4)

    def clear(self, client: Any, prefix: str, name: str) -> int:
        self.cleared.append(name)
        return int(client.delete(f"{prefix}:{{{name}}}:fakesem"))


def test_other_kinds_show_up_through_the_kind_interface(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSemaphoreKind()
    others = [k for k in inspection.KINDS if k.kind != fake.kind]  # the fake stands in
    monkeypatch.setattr("django_redislock.ops.inspection.KINDS", [*others, fake])
    redis_client.set("redislock:{pool}:fakesem", "x")
    with Lock("pool"):
        data = listed()
        table, _ = run()
        only, _ = run("list", "--kind", "semaphore")
    assert [(d["name"], d["kind"]) for d in data] == [("pool", "lock"), ("pool", "semaphore")]
    sem = data[1]
    assert (sem["limit"], sem["waiters"], sem["fencing_token"], sem["ttl"]) == (5, 4, 9, 12.5)
    assert [h["mode"] for h in sem["holders"]] == [None, "read"]
    assert "2/5: web-1:1:T, web-2:2:T (read)" in table
    assert "semaphore" in only
    assert " lock " not in only
    out, _ = run("clear", "pool", "--kind", "semaphore", "--noinput")
    assert "Released semaphore pool" in out
    assert fake.cleared == ["pool"]


# the default subcommand, Django's global options, verbosity, wide names ----------------


def test_list_options_work_without_the_subcommand() -> None:
    with Lock("sku:1"), Lock("cron:daily"):
        out, _ = run("--json")
        assert [d["name"] for d in json.loads(out)] == ["cron:daily", "sku:1"]
        out, _ = run("--pattern", "sku:*", "--json")
        assert [d["name"] for d in json.loads(out)] == ["sku:1"]
        assert run("--kind", "semaphore")[0].strip() == "Nothing is held."


@pytest.mark.parametrize(
    "args",
    [
        ("-v", "0", "clear", "gone", "--noinput"),
        ("clear", "gone", "--noinput", "-v", "0"),
        ("clear", "gone", "--noinput", "--verbosity=0", "--traceback", "--no-color"),
        ("clear", "gone", "--noinput", "--skip-checks", "--force-color", "-v", "0"),
        ("clear", "gone", "--noinput", "--using", "default", "-v", "0"),
    ],
)
def test_verbosity_0_prints_nothing_but_errors_before_or_after_the_subcommand(
    args: tuple[str, ...],
) -> None:
    lock = Lock("gone", auto_renew=False)
    lock.acquire()
    assert run(*args) == ("", "")
    assert listed() == []
    with pytest.raises(LockLostError):
        lock.release()
    assert run("clear", "nobody", "--noinput", "-v", "0") == ("", "")


def test_verbosity_0_keeps_json_and_errors() -> None:
    with Lock("kept"):
        out, _ = run("list", "--json", "-v", "0")
    assert [d["name"] for d in json.loads(out)] == ["kept"]
    with pytest.raises(CommandError, match="exactly one"):
        run("clear", "--noinput", "-v", "0")


def test_inspect_rejects_list_filters() -> None:
    with pytest.raises(CommandError, match="not inspect"):
        run("--pattern", "x*", "inspect", "x")


DJANGO = (sys.executable, "-m", "django")
AFTER = ("--settings", "tests.settings", "--pythonpath", ".", "--no-color", "-v", "0")


def test_global_options_after_the_subcommand_from_the_shell(redis_url: str) -> None:
    lock = Lock("shell", auto_renew=False)
    lock.acquire()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "nowhere", "REDISLOCK_TEST_REDIS_URL": redis_url}
    proc = subprocess.run(
        [*DJANGO, "locks", "clear", "shell", "--noinput", *AFTER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert not lock.owned()
    proc = subprocess.run(
        [*DJANGO, "locks", "--json", "--settings", "tests.settings"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, json.loads(proc.stdout)) == (0, [])


def test_table_aligns_wide_names() -> None:
    from django_redislock.management.commands.locks import display_width

    assert display_width("在庫") == 4
    assert display_width("🔒x") == 3
    assert display_width("e\u0301") == 1  # e + combining acute accent
    with Lock("在庫:1"), Lock("🔒"), Lock("plain"):
        lines = run("--no-color")[0].splitlines()[:4]
    kind_columns = {display_width(line[: line.index(" lock ") + 1]) for line in lines[1:]}
    assert len(kind_columns) == 1
    assert display_width(lines[0][: lines[0].index("KIND")]) in kind_columns


def test_clear_logs_who_released_what_from_where(caplog: pytest.LogCaptureFixture) -> None:
    lock = Lock("audited", auto_renew=False)
    lock.acquire()
    with caplog.at_level("INFO", logger="django_redislock"):
        run("clear", "audited", "--noinput", "-v", "0")
    records = [r for r in caplog.records if r.name == "django_redislock.audit"]
    assert len(records) == 1
    record = records[0]
    assert record.levelname == "INFO"
    message = record.getMessage()
    assert "'audited'" in message
    assert "manage.py locks clear" in message
    assert f"pid {os.getpid()}" in message
    assert record.released_by  # type: ignore[attr-defined]
    assert record.lock_holders[0].split(":")[1] == str(os.getpid())  # type: ignore[attr-defined]
    assert record.lock_holders[0] in message  # type: ignore[attr-defined]
    with pytest.raises(LockLostError):
        lock.release()


def test_a_lock_value_this_version_cannot_read_is_listed_and_clearable(
    redis_client: redis.Redis,
) -> None:
    """It blocks the name; the tools said it was not held (found by a review)."""
    redis_client.set("redislock:{legacy}:lock", "old-format-value")
    redis_client.hset("redislock:{odd}:lock", "field", "value")
    assert not Lock("legacy").acquire(blocking=False)
    assert [(d["name"], d["holders"][0]["holder"][:7]) for d in listed()] == [
        ("legacy", "unknown"),
        ("odd", "unknown"),
    ]
    out, err = run("clear", "legacy", "odd", "--noinput")
    assert (err, "Released 2 of 2." in out) == ("", True)
    lock = Lock("legacy")
    assert lock.acquire(blocking=False)
    lock.release()


def test_inspect_shows_a_since_out_of_range_in_one_line(redis_client: redis.Redis) -> None:
    for since in ("300000000000000", "9" * 19):
        redis_client.set("redislock:{future}:lock", f"ab12:0:1:5:30000:{since}:host:1:T")
        out, _ = run("inspect", "future")
        assert "out of range" in out


def test_a_permit_key_of_another_type_is_listed_and_clearable(redis_client: redis.Redis) -> None:
    redis_client.set("redislock:{odd}:semaphore", "x")
    redis_client.set("redislock:{odd2}:rw:queue", "x")
    with Lock("sku:1"):
        rows = {(d["name"], d["kind"]): d for d in listed()}
    assert set(rows) == {("odd", "semaphore"), ("sku:1", "lock")}  # (listed by the main key)
    assert rows["odd", "semaphore"]["holders"][0]["holder"].startswith("unknown")
    out, err = run("clear", "odd", "odd2", "--noinput")
    assert "Released semaphore odd" in out  # (odd2 had no holder: only its queue was odd)
    assert err == ""
    assert not redis_client.exists("redislock:{odd}:semaphore", "redislock:{odd2}:rw:queue")
