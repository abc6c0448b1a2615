"""``@single_run``: one run of a management command at a time, across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_redislock import ALREADY_RUNNING, Lock, single_run
from tests.support.other_holders import OtherThread

ROOT = Path(__file__).resolve().parent.parent


def manage(redis_url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "django", "nightly", "--redis", redis_url, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_overlapping_run_exits_with_already_running(
    redis_url: str, redis_client: redis.Redis
) -> None:
    first = manage(redis_url)
    try:
        assert redis_client.blpop(["nightly:started"], timeout=60) is not None  # first holds it
        second = manage(redis_url)
        _, err = second.communicate(timeout=60)
        assert second.returncode == ALREADY_RUNNING == 75
        assert err.strip().count("\n") == 0, err  # one line, no traceback
        assert "nightly is already running" in err and "report:today" in err
        other_day = manage(redis_url, "--day", "yesterday")  # another name: runs
        assert redis_client.blpop(["nightly:started"], timeout=60) == (
            b"nightly:started",
            b"yesterday",
        )
    finally:
        redis_client.rpush("nightly:finish", "go", "go")
        first.communicate(timeout=60)
    assert first.returncode == 0
    other_day.communicate(timeout=60)
    assert other_day.returncode == 0
    assert not Lock("report:today").locked()  # released when the run ended


class Failing(BaseCommand):
    @single_run("failing")
    def handle(self, *args: Any, **options: Any) -> None:
        assert Lock("failing").locked()
        raise RuntimeError("the job failed")


def test_the_lock_is_released_when_the_run_fails() -> None:
    with pytest.raises(RuntimeError, match="the job failed"):
        Failing().handle()
    assert not Lock("failing").locked()


def test_call_command_raises_command_error_with_the_returncode(other_thread: Any) -> None:
    holder = Lock("command:test_single_run")
    other_thread(holder.acquire)

    class Busy(BaseCommand):
        @single_run()
        def handle(self, *args: Any, **options: Any) -> None:
            raise AssertionError("must not run")

    with pytest.raises(CommandError) as info:
        call_command(Busy())
    assert info.value.returncode == ALREADY_RUNNING
    other_thread(holder.release)


def test_a_placeholder_that_is_not_an_option_is_a_clear_error() -> None:
    class Command(BaseCommand):
        @single_run("report:<nope>")
        def handle(self, *args: Any, **options: Any) -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="<nope>"):
        Command().handle(day="x")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"blocking_timeout": -1}, ValueError),
        ({"timeout": 0}, ValueError),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        single_run(**kwargs)


def test_redis_unreachable_is_a_failed_run_not_a_skipped_one() -> None:
    from django.test import override_settings

    from tests.settings import redis_cache
    from tests.support.servers import free_port

    class Nightly(BaseCommand):
        @single_run("down")
        def handle(self, *args: Any, **options: Any) -> None:
            raise AssertionError("must not run")

    down = redis_cache(f"redis://127.0.0.1:{free_port()}/0", SOCKET_CONNECT_TIMEOUT=0.5)
    with override_settings(CACHES={"default": down}), pytest.raises(CommandError) as info:
        call_command(Nightly())
    assert info.value.returncode == 1
    assert "could not take its lock 'down'" in str(info.value)


@pytest.mark.parametrize("day", ["2026-11-25\nrm", "x" * 2000])
def test_an_option_value_that_makes_a_bad_lock_name_is_a_command_error(day: str) -> None:
    class Report(BaseCommand):
        @single_run("report:<day>")
        def handle(self, *args: Any, **options: Any) -> None:
            raise AssertionError("must not run")

    with pytest.raises(CommandError, match="lock name") as info:
        Report().handle(day=day)
    assert info.value.returncode == 1


# found by a review of the Django integration --------------------------------------------


def _release_fails(self: Lock) -> None:
    from django_redislock import LockBackendError

    raise LockBackendError("Redis went away", name=self.name)


def test_a_failed_release_never_replaces_the_runs_own_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(BaseCommand):
        @single_run("broken")
        def handle(self, *args: Any, **options: Any) -> None:
            raise RuntimeError("the run's own failure")

    monkeypatch.setattr("django_redislock.Lock.release", _release_fails)
    with pytest.raises(RuntimeError, match="own failure"):
        call_command(Broken())
    assert "Could not release 'broken' after a failed run: Redis went away" in caplog.text


def test_a_release_that_fails_after_a_good_run_is_a_command_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Fine(BaseCommand):
        @single_run("fine")
        def handle(self, *args: Any, **options: Any) -> None:
            return None

    monkeypatch.setattr("django_redislock.Lock.release", _release_fails)
    with pytest.raises(CommandError, match="ran, but its lock 'fine' failed at the end") as info:
        call_command(Fine())
    assert info.value.returncode == 1


def test_the_retry_hint_is_never_zero_seconds(other_thread: Any) -> None:
    class Short(BaseCommand):
        @single_run("short", blocking_timeout=0)
        def handle(self, *args: Any, **options: Any) -> None:
            raise AssertionError("must not run")

    held = Lock("short", timeout=0.4, auto_renew=False)
    assert other_thread(held.acquire)
    with pytest.raises(CommandError, match=r"retry in about 1 s\.$"):
        call_command(Short())


def test_the_documented_once_per_period_command_runs_once_per_day(
    other_thread: OtherThread,
) -> None:
    """docs/commands.md's last command, run from the page: a second run of the
    same day, after the first ended, sends nothing; another day sends."""
    import datetime
    import re

    from django.core.cache import cache

    page = ROOT / "docs" / "commands.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if "reminders-sent" in block]
    code, sends = re.subn(r"\.\.\. +# send them", "sent.append(options['day'])", code)
    assert sends == 1
    sent: list[str] = []
    namespace: dict[str, Any] = {"__name__": "shop.management.commands.remind", "sent": sent}
    exec(compile(code, str(page), "exec"), namespace)
    command = namespace["Command"]
    today = datetime.date.today().isoformat()
    try:
        call_command(command())
        call_command(command())  # another host's cron, after the first run ended
        call_command(command(), day="2000-01-01")
        assert sent == [today, "2000-01-01"]
        assert not Lock(f"reminders:{today}").locked()
        elsewhere = Lock(f"reminders:{today}")
        other_thread(elsewhere.acquire)  # a run still going on another host...
        try:
            with pytest.raises(CommandError) as running:
                call_command(command())
        finally:
            other_thread(elsewhere.release)
        assert running.value.returncode == ALREADY_RUNNING  # ...makes the next one a skip
    finally:
        cache.delete_many([f"reminders-sent:{today}", "reminders-sent:2000-01-01"])
