"""``manage.py locks``: list, inspect and clear held locks, semaphores and read-write locks."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislock import backend, inspection
from django_redislock.inspection import HeldInfo
from django_redislock.ops import (
    OpsError,
    check_kinds,
    check_name_arg,
    check_pattern,
    connect,
    describe_error,
    holder_data,
    info_data,
)

#: Show progress while clearing when there are more targets than this.
PROGRESS_THRESHOLD = 1000


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _extra(key: str, value: Any) -> str:
    if key == "since" and isinstance(value, int | float) and value > 0:
        moment = datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
        return f"{moment:%Y-%m-%d %H:%M:%S} UTC (the holder's clock)"
    if key == "lease" and isinstance(value, int | float):
        return f"{value:g}s"
    return str(value)


class Command(BaseCommand):
    help = (
        "List, inspect and clear held locks, semaphores and read-write locks. "
        "Without a subcommand: list."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--using",
            metavar="ALIAS",
            help="Cache alias whose Redis to inspect (default: REDISLOCK['CACHE']).",
        )
        sub = parser.add_subparsers(dest="action", metavar="{list,inspect,clear}")

        listing = sub.add_parser("list", help="List every held primitive (the default).")
        self._add_filters(listing)
        listing.add_argument(
            "--json", action="store_true", help="Print stable JSON for scripts instead of a table."
        )

        inspect = sub.add_parser("inspect", help="Everything known about one name.")
        inspect.add_argument("name", help="The name, exactly as the code wrote it.")
        inspect.add_argument("--json", action="store_true", help="Print JSON instead of text.")

        clear = sub.add_parser(
            "clear",
            help="Release held primitives whoever holds them; their holders get LockLostError.",
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
    def _add_filters(parser: CommandParser) -> None:
        parser.add_argument(
            "--pattern",
            metavar="GLOB",
            help="Only names matching this glob (*, ?, [abc], [!abc]); quote it in the shell.",
        )
        parser.add_argument(
            "--kind",
            action="append",
            metavar="KIND",
            help="Only this kind (lock, semaphore, rwlock); repeat for several.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action") or "list"
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
            self.stdout.write("Nothing is held.")
            return
        self._table(held)

    def _table(self, held: Sequence[HeldInfo]) -> None:
        header = ("NAME", "KIND", "HOLDERS", "TTL", "FENCING TOKEN", "WAITERS")
        rows = []
        for info in held:
            holders = ", ".join(
                h.holder
                + (f" ({h.mode})" if h.mode else "")
                + (f" x{h.count}" if h.count > 1 else "")
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
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        self.stdout.write(self.style.MIGRATE_HEADING(line(header)))
        for row in rows:
            self.stdout.write(line(row))
        self.stdout.write(self.style.MIGRATE_LABEL(f"{len(rows)} held."))

    # inspect --------------------------------------------------------------------------

    def _inspect(self, client: Any, prefix: str, options: dict[str, Any]) -> None:
        name = check_name_arg(options["name"])
        infos = inspection.describe(client, prefix, name)
        counters = inspection.stats(client, prefix, [name])[0]
        if options.get("json"):
            data = {
                "name": name,
                "held": [info_data(i) for i in infos],
                "counters": counters,
            }
            self.stdout.write(json.dumps(data, sort_keys=True))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(name))
        if not infos:
            self.stdout.write("  Not held.")
        for info in infos:
            limit = f", limit {info.limit}" if info.limit is not None else ""
            self.stdout.write(
                f"  {self.style.MIGRATE_LABEL(info.kind)}: {len(info.holders)} holder(s){limit}, "
                f"{info.waiters} waiter(s)"
            )
            for h in holder_data(info):
                mode = f" mode={h['mode']}" if h["mode"] else ""
                self.stdout.write(
                    f"    {h['holder']}  token={h['token']}…  ttl={_seconds(h['ttl'])}  "
                    f"fencing_token={h['fencing_token']}  depth={h['count']}{mode}"
                )
            for key, value in sorted(info.extra.items()):
                self.stdout.write(f"    {key}: {_extra(key, value)}")
        if counters:
            self.stdout.write(
                "  counters: "
                + ", ".join(f"{k}={counters.get(k, 0)}" for k in inspection.STAT_FIELDS)
            )
        else:
            self.stdout.write("  counters: none (idle, or REDISLOCK['STATS'] is off)")

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
                self.stderr.write(f"Not held: {name}")
        else:
            targets = self._select(client, prefix, options)
        targets.sort(key=lambda info: (info.name, info.kind))
        if not targets:
            self.stdout.write("Nothing to clear.")
            return
        self.stdout.write(f"This will release {len(targets)} held primitive(s):")
        for info in targets[:50]:
            self.stdout.write(f"  {info.kind} {info.name} ({len(info.holders)} holder(s))")
        if len(targets) > 50:
            self.stdout.write(f"  … and {len(targets) - 50} more")
        if options.get("interactive", True) and not self._confirm():
            self.stdout.write("Cancelled.")
            return
        self._release(client, prefix, targets)

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

    def _release(self, client: Any, prefix: str, targets: list[HeldInfo]) -> None:
        by_kind: dict[str, list[str]] = {}
        for info in targets:
            by_kind.setdefault(info.kind, []).append(info.name)
        total, done, released = len(targets), 0, 0
        show_progress = total > PROGRESS_THRESHOLD
        for kind in inspection.kinds(by_kind):
            for name, count in inspection.clear_many(kind, client, prefix, by_kind[kind.kind]):
                done += 1
                if count:
                    released += 1
                    if not show_progress:
                        self.stdout.write(self.style.SUCCESS(f"Released {kind.kind} {name}"))
                if show_progress and (done % inspection.DESCRIBE_BATCH == 0 or done == total):
                    self.stderr.write(
                        f"Cleared {done}/{total}…", ending="\r" if sys.stderr.isatty() else "\n"
                    )
        self.stdout.write(self.style.SUCCESS(f"Released {released} of {total}."))
