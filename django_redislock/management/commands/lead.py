"""``manage.py lead NAME -- COMMAND [ARGS...]``: run COMMAND only while this process leads NAME.

Run it on every pod; one leads and runs COMMAND, the others stand by and take
over when it stops, dies or loses its lease (``ops/runner.py``,
``docs/long-holds.md``).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock.ops.runner import Runner, find_program
from django_redislock.validation import check_alias, check_lease, check_name, check_seconds

#: Seconds COMMAND has to exit after SIGTERM before it gets SIGKILL.
DEFAULT_GRACE = 10.0


def _plain(message: str) -> str:
    """The runner's news on stderr is not an error: no ERROR colouring."""
    return message


class _DashParser(CommandParser):
    """Everything after the first ``--`` is COMMAND, verbatim: argparse alone
    would match NAME and COMMAND in one go before the ``--`` and refuse the rest."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        given = list(sys.argv[2:] if args is None else args)
        after: list[str] = []
        if "--" in given:
            at = given.index("--")
            given, after = given[:at], given[at + 1 :]
        parsed = super().parse_args(given, namespace)
        parsed.program = [*parsed.program, *after]
        return parsed


class Command(BaseCommand):
    help = (
        "Run COMMAND (given after --) only while this process leads NAME: standbys wait, "
        "and take over when the leader stops, dies or loses its lease. Exits with "
        "COMMAND's status."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = _DashParser
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", metavar="NAME", help="The leadership's name.")
        parser.add_argument(
            "program",
            nargs="*",
            metavar="COMMAND",
            help="The command and its arguments, after -- (e.g. -- celery -A proj beat).",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            metavar="SECONDS",
            help="The leader's lease: how long a dead or paused leader keeps NAME "
            "(default: REDISLOCK['TIMEOUT']).",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=DEFAULT_GRACE,
            metavar="SECONDS",
            help=f"After SIGTERM, how long COMMAND may take to exit before SIGKILL "
            f"(default {DEFAULT_GRACE:g}).",
        )
        parser.add_argument(
            "--using", metavar="ALIAS", help="Cache alias whose Redis to use (default: "
            "REDISLOCK['CACHE'])."
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        program = list(options["program"])
        if not program:
            raise CommandError("Give the command to run after --, e.g. lead beat -- celery beat.")
        try:
            name = check_name(options["name"], "NAME")
            timeout = check_lease(options["timeout"], "--timeout")
            grace = check_seconds(options["grace"], "--grace", allow_none=False, allow_zero=True)
            using = check_alias(options["using"])
        except (TypeError, ValueError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        if find_program(program[0]) is None:
            raise CommandError(f"{program[0]!r}: no such program (not found, or not executable).")
        verbosity = int(options["verbosity"])

        def say(message: str) -> None:
            if verbosity > 0:
                self.stderr.write(f"lead {name}: {message}", style_func=_plain)

        runner = Runner(
            name, program, timeout=timeout, grace=float(grace or 0), using=using, say=say
        )
        try:
            status = runner.run()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        if status:
            sys.exit(status)
