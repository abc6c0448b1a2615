"""A cron-style command for the single-run tests: holds its lock until told to finish."""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandParser

from django_redislock import single_run


class Command(BaseCommand):
    help = "Push 'started' to a Redis list, wait for 'finish' on another, then return."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--redis", required=True, help="the test's Redis URL")
        parser.add_argument("--day", default="today", help="which day's report")

    @single_run("report:<day>")
    def handle(self, *args: Any, **options: Any) -> None:
        # no socket timeout: redis-py 8 defaults to 5 s, and on a loaded machine the
        # test's second process can take longer than that to start and say "finish"
        client = redis.Redis.from_url(options["redis"], socket_timeout=None)
        client.rpush("nightly:started", options["day"])
        client.blpop(["nightly:finish"], timeout=30)  # the test says when
        self.stdout.write("done")
