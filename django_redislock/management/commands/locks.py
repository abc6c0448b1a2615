"""``manage.py locks``: list, inspect and clear held locks, semaphores and read-write locks."""

from __future__ import annotations

import datetime
import json
import sys
import unicodedata
from argparse import SUPPRESS
from collections.abc import Callable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.ops import audit, inspection
from django_redislock.ops.common import (
    OpsError,
    check_kinds,
    check_name_arg,
    check_pattern,
    connect,
    describe_error,
    edit_lease_data,
    edit_lease_text,
    holder_data,
    info_data,
)
from django_redislock.ops.inspection import HeldInfo

#: Show progress while clearing when there are more targets than this.
PROGRESS_THRESHOLD = 1000


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _detached(since: float | None) -> str:
    """`` detached (since ...)`` for a hold waiting for its adopter (``Lock.detach``)."""
    if since is None:
        return ""
    try:
        moment = datetime.datetime.fromtimestamp(since, tz=datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):  # a value by hand
        return " detached"
    return f" detached (since {moment:%Y-%m-%d %H:%M:%S} UTC)"


def _extra(key: str, value: Any) -> str:
    if key == "since" and isinstance(value, int | float) and value > 0:
        try:
            moment = datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
        except (ValueError, OverflowError, OSError):  # a clock far off, or a value by hand
            return f"{value:g} (the holder's clock, out of range)"
        return f"{moment:%Y-%m-%d %H:%M:%S} UTC (the holder's clock)"
    if key == "lease" and isinstance(value, int | float):
        return f"{value:g}s"
    return str(value)


def _holder_text(name: str, holder: str) -> str:
    """A holder as the table shows it: an admin edit lease by who edits what, since when."""
    edit = edit_lease_data(name, holder)
    return holder if edit is None else f"admin edit lease: {edit_lease_text(edit)}"


def _global_options() -> CommandParser:
    """Django's global options (and ``--using``) again for each subcommand.

    Their defaults are suppressed, so given before the subcommand they are
    kept, and given after it they override: ``locks -v 0 clear x`` and
    ``locks clear x -v 0`` mean the same.
    """
    common = CommandParser(add_help=False, argument_default=SUPPRESS)
    common.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], help="0: errors only.")
    common.add_argument("--settings", help="The Python path to a settings module.")
    common.add_argument("--pythonpath", help="A directory to add to the Python path.")
    common.add_argument("--traceback", action="store_true", help="Show the stack trace on errors.")
    common.add_argument("--no-color", action="store_true", help="Don't colorize the output.")
    common.add_argument("--force-color", action="store_true", help="Force colorized output.")
    common.add_argument("--skip-checks", action="store_true", help="Skip system checks.")
    common.add_argument("--using", metavar="ALIAS", help=USING_HELP)
    return common


USING_HELP = "Cache alias whose Redis to use (default: REDISLOCK['CACHE'])."
JSON_HELP = "Print stable JSON for scripts instead of text (printed even with -v 0)."


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: wide (CJK, most emoji) characters take
    two, combining marks and format characters (joiners, variation selectors)
    none."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


class Command(BaseCommand):
    help = (
        "List, inspect and clear held locks, leaderships, semaphores and read-write locks. "
        "Without a subcommand: list (so 'locks --json' is 'locks list --json')."
    )
    verbosity = 1

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--using", metavar="ALIAS", help=USING_HELP)
        # the default subcommand's options, for ``locks --json`` / ``locks --pattern X``
        self._add_filters(parser, default=None)
        parser.add_argument("--json", action="store_true", help=JSON_HELP)
        sub = parser.add_subparsers(dest="action", metavar="{list,inspect,clear}")
        common = _global_options()

        listing = sub.add_parser(
            "list", help="List every held primitive (the default).", parents=[common]
        )
        self._add_filters(listing)
        listing.add_argument("--json", action="store_true", default=SUPPRESS, help=JSON_HELP)

        inspect = sub.add_parser(
            "inspect", help="Everything known about one name.", parents=[common]
        )
        inspect.add_argument("name", help="The name, exactly as the code wrote it.")
        inspect.add_argument("--json", action="store_true", default=SUPPRESS, help=JSON_HELP)

        clear = sub.add_parser(
            "clear",
            help="Release held primitives whoever holds them; their holders get LockLostError.",
            parents=[common],
        )
        clear.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help="Names to clear, taken literally ('a*' clears only the name 'a*').",
        )
        self._add_filters(clear)
        clear.add_argument("--all", action="store_true", help="Clear every held primitive.")
        clear.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation.",
        )

    @staticmethod
    def _add_filters(parser: CommandParser, default: Any = SUPPRESS) -> None:
        parser.add_argument(
            "--pattern",
            metavar="GLOB",
            default=default,
            help="Only names matching this glob (*, ?, [abc], [!abc]); quote it in the shell.",
        )
        parser.add_argument(
            "--kind",
            action="append",
            metavar="KIND",
            default=default,
            help="Only this kind (lock, leadership, semaphore, rwlock, idempotency, once); "
            "repeat for several.",
        )

    def say(self, message: str, style: Callable[[str], str] | None = None) -> None:
        """Write a message for people; ``-v 0`` keeps only errors."""
        if self.verbosity > 0:
            self.stdout.write(style(message) if style else message)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action") or "list"
        self.verbosity = int(options.get("verbosity", 1))
        if action == "inspect" and (options.get("pattern") or options.get("kind")):
            raise CommandError("--pattern and --kind are for list and clear, not inspect.")
        handler: Callable[[Any, str, dict[str, Any]], None] = getattr(self, f"_{action}")
        try:
            client, prefix = connect(options.get("using"))
            handler(client, prefix, options)
        except OpsError as exc:
            raise CommandError(str(exc)) from exc
        except backend.BACKEND_ERRORS as exc:
            raise CommandError(describe_error(exc)) from exc

    # list ------------------------------------------------------------------------

    def _select(self, client: Any, prefix: str, options: dict[str, Any]) -> list[HeldInfo]:
        pattern = options.get("pattern")
        if pattern is not None:
            pattern = check_pattern(pattern)
        return inspection.list_held(
            client, prefix, pattern=pattern, selected=check_kinds(options.get("kind"))
        )

    def _list(self, client: Any, prefix: str, options: dict[str, Any]) -> None:
        held = self._select(client, prefix, options)
        if options.get("json"):
            # one write: OutputWrapper.write per JSON chunk costs seconds at 100k names
            self.stdout.write(json.dumps([info_data(i) for i in held], sort_keys=True))
            return
        if not held:
            self.say("Nothing is held.")
            return
        self._table(held)

    def _table(self, held: Sequence[HeldInfo]) -> None:
        header = ("NAME", "KIND", "HOLDERS", "TTL", "FENCING TOKEN", "WAITERS")
        rows = []
        for info in held:
            holders = ", ".join(
                _holder_text(info.name, h.holder)
                + (f" ({h.mode})" if h.mode else "")
                + (f" x{h.count}" if h.count > 1 else "")
                + _detached(h.detached_since)
                for h in info.holders
            )
            if info.limit is not None:
                holders = f"{len(info.holders)}/{info.limit}: {holders}"
            fence = info.fencing_token
            rows.append(
                (
                    info.name,
                    info.kind,
                    holders,
                    _seconds(info.ttl),
                    "-" if fence is None else str(fence),
                    str(info.waiters),
                )
            )
        widths = [max(display_width(r[i]) for r in [header, *rows]) for i in range(len(header))]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(
                c + " " * (w - display_width(c)) for c, w in zip(cells, widths, strict=True)
            ).rstrip()

        self.say(line(header), self.style.MIGRATE_HEADING)
        for row in rows:
            self.say(line(row))
        self.say(f"{len(rows)} held.", self.style.MIGRATE_LABEL)

    # inspect --------------------------------------------------------------------------

    def _inspect(self, client: Any, prefix: str, options: dict[str, Any]) -> None:
        name = check_name_arg(options["name"])
        infos = inspection.describe(client, prefix, name)
        # off: what is left in Redis (kept up to an hour) is no longer counted
        counting = get_settings().stats
        counters = inspection.stats(client, prefix, [name])[0] if counting else {}
        if options.get("json"):
            data = {
                "name": name,
                "held": [info_data(i) for i in infos],
                "counters": counters,
            }
            self.stdout.write(json.dumps(data, sort_keys=True))
            return
        self.say(name, self.style.MIGRATE_HEADING)
        if not infos:
            self.say("  Not held.")
        for info in infos:
            limit = f", limit {info.limit}" if info.limit is not None else ""
            counts = (
                f"led by {info.holders[0].holder}, {info.waiters} standby(s) waiting"
                if info.kind == "leadership"
                else f"{len(info.holders)} holder(s){limit}, {info.waiters} waiter(s)"
            )
            self.say(f"  {self.style.MIGRATE_LABEL(info.kind)}: {counts}")
            for h in holder_data(info):
                if h["edit_lease"] is not None:
                    self.say(f"    admin edit lease: {edit_lease_text(h['edit_lease'])}")
                mode = f" mode={h['mode']}" if h["mode"] else ""
                self.say(
                    f"    {h['holder']}  token={h['token']}…  ttl={_seconds(h['ttl'])}  "
                    f"fencing_token={h['fencing_token']}  depth={h['count']}{mode}"
                    + _detached(h["detached_since"])
                )
            for key, value in sorted(info.extra.items()):
                self.say(f"    {key}: {_extra(key, value)}")
        if not counting:
            self.say("  counters: off (REDISLOCK['STATS'] is False)")
        elif counters:
            self.say(
                "  counters: "
                + ", ".join(f"{k}={counters.get(k, 0)}" for k in inspection.STAT_FIELDS)
            )
        elif infos and all(info.kind not in ("lock", "leadership") for info in infos):
            kinds = " and ".join(sorted({f"{info.kind}s" for info in infos}))
            self.say(f"  counters: none (kept for locks only, not for {kinds})")
        else:
            self.say("  counters: none (idle)")

    # clear ------------------------------------------------------------------------------

    def _clear(self, client: Any, prefix: str, options: dict[str, Any]) -> None:
        names: list[str] = options["names"]
        chosen = sum(bool(x) for x in (names, options.get("pattern"), options.get("all")))
        if chosen != 1:
            raise CommandError("Give names to clear, or --pattern GLOB, or --all (exactly one).")
        if names:
            for name in names:
                check_name_arg(name)
            wanted = set(names)
            selected = check_kinds(options.get("kind"))
            targets = [
                info
                for kind in inspection.kinds(selected)
                for info in inspection.describe_many(kind, client, prefix, sorted(wanted))
            ]
            missing = wanted - {info.name for info in targets}
            for name in sorted(missing):
                if self.verbosity > 0:
                    self.stderr.write(f"Not held: {name}")
        else:
            targets = self._select(client, prefix, options)
        targets.sort(key=lambda info: (info.name, info.kind))
        if not targets:
            self.say("Nothing to clear.")
            return
        interactive = options.get("interactive", True)
        if interactive or self.verbosity > 0:  # asking needs the list, whatever -v says
            head = "This will release" if interactive else "Releasing"
            self.stdout.write(f"{head} {len(targets)} held primitive(s):")
            for info in targets[:50]:
                self.stdout.write(f"  {info.kind} {info.name} ({len(info.holders)} holder(s))")
            if len(targets) > 50:
                self.stdout.write(f"  … and {len(targets) - 50} more")
        if interactive and not self._confirm():
            self.stdout.write("Cancelled.")
            return
        self._release(client, prefix, targets, confirmed=interactive)

    def _confirm(self) -> bool:
        try:
            answer = input(
                "Their holders will lose them (LockLostError). Type 'yes' to continue, "
                "or 'no' to cancel: "
            )
        except (EOFError, KeyboardInterrupt) as exc:
            raise CommandError(
                "Cancelled: no confirmation (use --noinput to clear without asking)."
            ) from exc
        return answer.strip().lower() == "yes"

    def _release(
        self, client: Any, prefix: str, targets: list[HeldInfo], *, confirmed: bool
    ) -> None:
        """Clear ``targets``; ``confirmed``: only where the holders listed
        still hold the name, checked in the script that clears, so a name that
        changed hands while the operator read the list is left to its new
        holder, nobody having been shown it."""
        by_kind = _names_by_kind(targets)
        listed = {(i.kind, i.name): i for i in targets}
        who, where = audit.os_user(), audit.this_process("manage.py locks clear")
        total, done, released = len(targets), 0, 0
        show_progress = total > PROGRESS_THRESHOLD and self.verbosity > 0
        for kind in inspection.kinds(by_kind):
            names = by_kind[kind.kind]
            held_by = {n: listed[kind.kind, n] for n in names} if confirmed else None
            for name, count in inspection.clear_many(
                kind, client, prefix, names, confirmed=held_by
            ):
                done += 1
                if confirmed and count <= 0 and self.verbosity > 0:
                    self.stderr.write(
                        f"Not cleared, changed hands since listed: {name}"
                        if count == inspection.CHANGED_HANDS
                        else f"Not held any more: {name}"
                    )
                if count > 0:
                    released += 1
                    audit.log_force_release(
                        name,
                        kind=kind.kind,
                        who=who,
                        where=where,
                        holders=[h.holder for h in listed[kind.kind, name].holders],
                    )
                    if total <= PROGRESS_THRESHOLD:
                        self.say(f"Released {kind.kind} {name}", self.style.SUCCESS)
                if show_progress and (done % inspection.DESCRIBE_BATCH == 0 or done == total):
                    self.stderr.write(
                        f"Cleared {done}/{total}…", ending="\r" if sys.stderr.isatty() else "\n"
                    )
        self.say(f"Released {released} of {total}.", self.style.SUCCESS)


def _names_by_kind(targets: list[HeldInfo]) -> dict[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for info in targets:
        by_kind.setdefault(info.kind, []).append(info.name)
    return by_kind
