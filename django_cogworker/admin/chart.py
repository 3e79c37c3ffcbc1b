"""The dashboard's charts, as the geometry of inline SVGs: jobs processed and
failed per day (``history_chart``) and per minute over the last hour
(``minute_chart``), both bar charts drawn by ``bar_chart``.

Drawn by the template with no script and nothing fetched from elsewhere;
their colours are the admin's CSS variables, so they follow dark mode.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

WIDTH_PX = 900
HEIGHT_PX = 220
#: The last hour's chart is a strip above the history.
MINUTE_HEIGHT_PX = 160
#: Room for the value labels (left) and the day or minute labels (bottom).
MARGIN_LEFT_PX, MARGIN_RIGHT_PX, MARGIN_TOP_PX, MARGIN_BOTTOM_PX = 52, 8, 10, 24
#: Day labels shown at most, whatever the range.
MAX_DAY_LABELS = 8
#: The last hour's chart labels the minutes that are a multiple of this.
MINUTE_LABEL_EVERY = 10
GRID_LINES = 4


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css_class: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Point:
    """One column of a chart: its tooltip, its axis label ("" for none) and
    its two bars."""

    title: str
    label: str
    processed: int
    failed: int


@dataclass
class Chart:
    width: int = WIDTH_PX
    height: int = HEIGHT_PX
    left: float = MARGIN_LEFT_PX
    right: float = WIDTH_PX - MARGIN_RIGHT_PX
    bottom: float = HEIGHT_PX - MARGIN_BOTTOM_PX
    bars: list[Bar] = field(default_factory=list)
    grid: list[Label] = field(default_factory=list)
    ticks: list[Label] = field(default_factory=list)
    summary: str = ""


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... that is at least ``value``."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def bar_chart(points: list[Point], column_class: str, *, height: int = HEIGHT_PX) -> Chart:
    """Processed and failed bars, one pair per point, the first on the left.
    Each point's whole column is a transparent bar of ``column_class`` that
    carries the tooltip, so a point of zeros has one too."""
    chart = Chart(height=height, bottom=height - MARGIN_BOTTOM_PX)
    if not points:
        return chart
    top = nice_ceiling(max(max(p.processed, p.failed) for p in points))
    plot_top = float(MARGIN_TOP_PX)
    plot_height = chart.bottom - plot_top
    slot = (chart.right - chart.left) / len(points)
    bar_width = max(1.0, slot * 0.4)

    def y_of(value: int) -> float:
        return chart.bottom - plot_height * value / top

    for i in range(GRID_LINES + 1):
        value = top * i // GRID_LINES
        chart.grid.append(Label(chart.left, round(y_of(value), 1), f"{value:,}"))
    for index, point in enumerate(points):
        x = chart.left + index * slot + slot * 0.1
        chart.bars.append(
            Bar(
                round(chart.left + index * slot, 1),
                plot_top,
                round(slot, 1),
                plot_height,
                column_class,
                point.title,
            )
        )
        for offset, value, css_class in (
            (0.0, point.processed, "processed"),
            (bar_width, point.failed, "failed"),
        ):
            y = y_of(value)
            chart.bars.append(
                Bar(
                    round(x + offset, 1),
                    round(y, 1),
                    round(bar_width, 1),
                    round(chart.bottom - y, 1),
                    css_class,
                    point.title,
                )
            )
        if point.label:
            chart.ticks.append(Label(round(x + bar_width, 1), chart.bottom + 16, point.label))
    return chart


def totals(series: Sequence[tuple[object, int, int]]) -> str:
    return f"{sum(p for _, p, _ in series):,} processed, {sum(f for _, _, f in series):,} failed"


def history_chart(history: list[tuple[dt.date, int, int]]) -> Chart:
    """Processed and failed bars, one pair per day, oldest on the left."""
    label_every = max(1, math.ceil(len(history) / MAX_DAY_LABELS))
    points = [
        Point(
            f"{day.isoformat()}: {processed:,} processed, {failed:,} failed",
            day.strftime("%b %d") if (len(history) - 1 - index) % label_every == 0 else "",
            processed,
            failed,
        )
        for index, (day, processed, failed) in enumerate(history)
    ]
    chart = bar_chart(points, "day")
    if history:
        first, last = history[0][0].isoformat(), history[-1][0].isoformat()
        chart.summary = f"Jobs per day from {first} to {last}: {totals(history)}"
    return chart


def minute_chart(minutes: list[tuple[dt.datetime, int, int]]) -> Chart:
    """Processed and failed bars, one pair per minute (UTC), oldest on the
    left: ``api.Stats.per_minute()``."""
    points = [
        Point(
            f"{minute:%H:%M} UTC: {processed:,} processed, {failed:,} failed",
            f"{minute:%H:%M}" if minute.minute % MINUTE_LABEL_EVERY == 0 else "",
            processed,
            failed,
        )
        for minute, processed, failed in minutes
    ]
    chart = bar_chart(points, "minute", height=MINUTE_HEIGHT_PX)
    if minutes:
        first, last = f"{minutes[0][0]:%H:%M}", f"{minutes[-1][0]:%H:%M}"
        chart.summary = f"Jobs per minute from {first} to {last} UTC: {totals(minutes)}"
    return chart
