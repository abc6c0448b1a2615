"""Run concurrent buyers against the shop, so the lock dashboard shows real load."""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock import LockBackendError, LockTimeout
from example_project import embedded_redis
from example_project.shop import load

BAR = 30


class Command(BaseCommand):
    help = (
        "Run concurrent buyers against the shop's buy view for a while, so the admin's "
        "Held locks dashboard shows holders, queues, hot names and charts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=60.0, help="How long to run.")
        parser.add_argument("--buyers", type=int, default=8, help="Concurrent buyer threads.")
        parser.add_argument(
            "--think-ms",
            type=int,
            default=150,
            help="Simulated payment time inside each purchase's lock (ms).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seconds, buyers, think_ms = options["seconds"], options["buyers"], options["think_ms"]
        if not 0 < seconds <= 3600:
            raise CommandError(f"--seconds must be between 0 and 3600, not {seconds:g}.")
        if not 1 <= buyers <= 64:
            raise CommandError(f"--buyers must be between 1 and 64, not {buyers}.")
        if not 0 <= think_ms <= 2000:
            raise CommandError(f"--think-ms must be between 0 and 2000, not {think_ms}.")
        where = settings.CACHES["default"]["LOCATION"]
        if embedded_redis.started_here():
            self.stderr.write(
                f"No REDIS_URL set and no running shop found: this run has an embedded "
                f"fakeredis server of its own at {where}, which no shop sees; start the shop "
                "first (bash scripts/shop), or use the shop page's *Make some load* button.",
                style_func=self.style.WARNING,
            )
        self.stdout.write(
            f"{buyers} buyers for {seconds:g} s against {where}; "
            "watch /admin/django_redislock/heldlock/"
        )
        tty = sys.stdout.isatty()
        shown: list[int] = []
        last = [""]

        def progress(elapsed: float, tally: load.Tally) -> None:
            done = int(BAR * elapsed / seconds)
            line = f"[{'#' * done}{'.' * (BAR - done)}] {elapsed:5.1f}/{seconds:g} s  "
            line += tally.summary()
            last[0] = line
            if tty:
                self.stdout.write("\r" + line, ending="")
            # A line per third when not a terminal; the full bar once the
            # buyers are done (time is up while their last purchases finish).
            elif done < BAR and done // 10 not in shown:
                shown.append(done // 10)
                self.stdout.write(line)

        try:
            tally = load.run(seconds=seconds, buyers=buyers, think_ms=think_ms, progress=progress)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        except LockTimeout as exc:  # report:daily: another run holds it
            raise CommandError(f"Another shop_load run is going ({exc}).") from exc
        except LockBackendError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("" if tty else last[0])
        self.stdout.write(self.style.SUCCESS(f"Done: {tally.summary()}."))
