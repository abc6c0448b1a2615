"""Small inline SVG charts for the dashboard, rendered on the server.

No script and no chart library: a chart is a few ``<rect>`` or ``<polyline>``
elements whose colours come from CSS classes (``dashboard.css``), so they
follow the admin's light and dark themes. Only numbers are interpolated into
the markup; the accessible title is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_redislock.ops.history import percentile

if TYPE_CHECKING:
    from django_redislock.ops.history import NameHistory

WIDTH = 180
HEIGHT = 32


def _svg(title: str, body: str) -> SafeString:
    return format_html(
        '<svg class="redislock-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img">'
        "<title>{}</title>{}</svg>",
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
        title,
        mark_safe(body),  # numbers and fixed class names only
    )


def bars(values: Sequence[int], title: str) -> SafeString:
    """One bar per value (per minute), scaled to the largest."""
    top = max(values, default=0) or 1
    step = WIDTH / max(len(values), 1)
    body = "".join(
        f'<rect class="bar" x="{i * step:.1f}" y="{HEIGHT - h:.1f}" '
        f'width="{max(step - 0.5, 0.5):.1f}" height="{h:.1f}"></rect>'
        for i, value in enumerate(values)
        if (h := HEIGHT * value / top) > 0
    )
    return _svg(title, f'<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>'
                + body)  # fmt: skip


def _points(values: Sequence[float | None], top: float) -> list[str]:
    step = WIDTH / max(len(values) - 1, 1)
    scale = math.log1p(top) or 1.0
    return [
        f"{i * step:.1f},{HEIGHT - 1 - (HEIGHT - 2) * math.log1p(v) / scale:.1f}"
        for i, v in enumerate(values)
        if v is not None
    ]


def lines(series: dict[str, Sequence[float | None]], title: str) -> SafeString:
    """One polyline per named series (the name is its CSS class), on a log scale
    shared by all series, so a p95 of seconds and a p50 of a millisecond both show."""
    top = max((v for s in series.values() for v in s if v is not None), default=0.0)
    body = "".join(
        f'<polyline class="{css}" points="{" ".join(points)}"></polyline>'
        if len(points) > 1
        else f'<circle class="{css}" cx="{x}" cy="{y}" r="1.5"></circle>'
        for css, values in series.items()
        if (points := _points(values, top))
        for x, y in [points[-1].split(",")]
    )
    return _svg(title, f'<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>'
                + body)  # fmt: skip


def peak(values: Sequence[float | None]) -> float | None:
    """The largest value shown, ``None`` when there is none."""
    return max((v for v in values if v is not None), default=None)


def median(values: Sequence[float | None]) -> float | None:
    """The median of the minutes that have a value above zero (an hour of
    mostly idle minutes would otherwise always read 0); ``None`` for none."""
    active = sorted(v for v in values if v)
    if not active:
        return None
    middle = len(active) // 2
    return active[middle] if len(active) % 2 else (active[middle - 1] + active[middle]) / 2


def name_charts(entry: NameHistory) -> dict[str, Any]:
    """One name's hot-names history with its charts, labelled with measured
    values over the hour the charts show: the peak and the median (of the
    minutes with any) of acquisitions per minute, the p95 and p50 of the
    hour's waits (histogram bucket bounds, hence "at most"), and the mean
    wait, which is exact.

    The wait labels are percentiles of the hour's pooled histogram, not the
    highest p95 and the median p50 of the minutes: a median of bucket bounds
    averaged two of them (a name with one 10 s wait read "p95 peak <= 30000
    ms, p50 median <= 15001 ms", a bound no bucket has), and the two could
    disagree for a single sample. Pooled, p50 <= p95 always, and one sample
    gives one bound."""
    waits = entry.totals["waits"]
    return {
        "name": entry.name,
        "totals": entry.totals,
        "acquired_chart": bars(entry.acquired, _("Acquisitions per minute of %s") % entry.name),
        "wait_chart": lines(
            {"p50": entry.p50_ms, "p95": entry.p95_ms},
            _("Wait p50 and p95 per minute of %s") % entry.name,
        ),
        "acquired_peak": peak(entry.acquired),
        "acquired_median": median(entry.acquired),
        "hour_p95": percentile(entry.waits, 0.95),
        "hour_p50": percentile(entry.waits, 0.5),
        "mean_wait_ms": entry.totals["wait_ms"] / waits if waits else None,
    }
