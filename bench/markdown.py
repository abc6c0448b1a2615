"""The result tables of ``docs/benchmarks.md``, from one run's JSON.

python -m bench --json > run.json && python -m bench.markdown < run.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.report import MODE_TITLES, number


def _pair(first: float | None, second: float | None) -> str:
    return f"{number(first, '.2f')} / {number(second, '.2f')}"


def render_markdown(data: dict[str, Any]) -> str:
    """One table per uncontended mode (per use first), then the contended table."""
    meta = data["meta"]
    labels = meta["labels"]
    lines = [
        f"{meta['date']}, {meta['machine']}, Python {meta['python']}, "
        f"redis-server {meta['redis']}, "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in meta["options"].items())
        + f"; {meta['seconds']:.0f} s in all.",
    ]
    for mode, rows in data["uncontended"].items():
        lines += [
            "",
            f"**{MODE_TITLES.get(mode, mode)}**",
            "",
            "| library | cycles/s | x raw | CPU x raw "
            "| Redis top us | x raw | Redis all us | x raw |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for lib, row in rows.items():
            lines.append(
                f"| {labels[lib]} | {row['cycles_per_s']:.0f} "
                f"| {number(row['ratio_to_raw'], '.2f')} "
                f"| {number(row.get('cpu_ratio_to_raw'), '.2f')} "
                f"| {number(row.get('redis_us_top'), '.1f')} "
                f"| {number(row.get('redis_top_x_raw'), '.2f')} "
                f"| {number(row.get('redis_us_all'), '.1f')} "
                f"| {number(row.get('redis_all_x_raw'), '.2f')} |"
            )
    if data["contended"]:
        lines += [
            "",
            "**Contended**",
            "",
            "| library | polite p50 / p99 ms | greedy p50 / p99 ms "
            "| greedy min/fair | violations |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for lib, modes in data["contended"].items():
            polite, greedy = modes["polite"], modes["greedy"]
            lines.append(
                f"| {labels[lib]} | {_pair(polite['p50_ms'], polite['p99_ms'])} "
                f"| {_pair(greedy['p50_ms'], greedy['p99_ms'])} "
                f"| {number(greedy['min_share_of_fair'], '.2f')} "
                f"| {polite['violations'] + greedy['violations']} |"
            )
    lines += ["", "| target for `Lock` | value | |", "| --- | --- | --- |"]
    lines += [f"| {t['target']} | {t['value'] or '-'} | {t['status']} |" for t in data["targets"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown(json.load(sys.stdin)))
