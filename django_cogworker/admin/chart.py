"""The dashboard's history chart, as the geometry of an inline SVG.

Drawn by the template with no script and nothing fetched from elsewhere;
its colours are the admin's CSS variables, so it follows dark mode.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

WIDTH_PX = 900
HEIGHT_PX = 220
#: Room for the value labels (left) and the day labels (bottom).
MARGIN_LEFT_PX, MARGIN_RIGHT_PX, MARGIN_TOP_PX, MARGIN_BOTTOM_PX = 52, 8, 10, 24
#: Day labels shown at most, whatever the range.
MAX_DAY_LABELS = 8
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


@dataclass
class Chart:
    width: int = WIDTH_PX
    height: int = HEIGHT_PX
    left: float = MARGIN_LEFT_PX
    right: float = WIDTH_PX - MARGIN_RIGHT_PX
    bottom: float = HEIGHT_PX - MARGIN_BOTTOM_PX
    bars: list[Bar] = field(default_factory=list)
    grid: list[Label] = field(default_factory=list)
    days: list[Label] = field(default_factory=list)
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


def history_chart(history: list[tuple[dt.date, int, int]]) -> Chart:
    """Processed and failed bars, one pair per day, oldest on the left."""
    chart = Chart()
    if not history:
        return chart
    top = nice_ceiling(max(max(p, f) for _, p, f in history))
    plot_top = float(MARGIN_TOP_PX)
    plot_height = chart.bottom - plot_top
    slot = (chart.right - chart.left) / len(history)
    bar_width = max(1.0, slot * 0.4)

    def y_of(value: int) -> float:
        return chart.bottom - plot_height * value / top

    for i in range(GRID_LINES + 1):
        value = top * i // GRID_LINES
        chart.grid.append(Label(chart.left, round(y_of(value), 1), f"{value:,}"))
    label_every = max(1, math.ceil(len(history) / MAX_DAY_LABELS))
    for index, (day, processed, failed) in enumerate(history):
        x = chart.left + index * slot + slot * 0.1
        title = f"{day.isoformat()}: {processed:,} processed, {failed:,} failed"
        # The whole day's column carries the tooltip, so a day of zeros has one too.
        chart.bars.append(
            Bar(round(chart.left + index * slot, 1), plot_top, round(slot, 1), plot_height, "day", title)
        )
        for offset, value, css_class in ((0.0, processed, "processed"), (bar_width, failed, "failed")):
            y = y_of(value)
            chart.bars.append(
                Bar(
                    round(x + offset, 1),
                    round(y, 1),
                    round(bar_width, 1),
                    round(chart.bottom - y, 1),
                    css_class,
                    title,
                )
            )
        if (len(history) - 1 - index) % label_every == 0:
            chart.days.append(Label(round(x + bar_width, 1), chart.bottom + 16, day.strftime("%b %d")))
    processed_total = sum(p for _, p, _ in history)
    failed_total = sum(f for _, _, f in history)
    chart.summary = (
        f"Jobs per day from {history[0][0].isoformat()} to {history[-1][0].isoformat()}: "
        f"{processed_total:,} processed, {failed_total:,} failed"
    )
    return chart
