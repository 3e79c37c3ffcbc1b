"""The Metrics pages' charts, as the geometry of inline SVGs (pure
functions of what the API returned, as ``chart.py``): runs and failures
per minute (``chart.bar_chart``'s pairs), mean execution time per minute
and the histogram of execution times (one series of bars,
``series_chart``), a dashed line at each deploy mark in range
(``with_marks``), and the small histogram of each row of the Metrics table
(``spark``).

Drawn by ``metrics_chart_svg.html`` with no script and nothing fetched from
elsewhere; the colours are the admin's CSS variables, so they follow dark
mode. Every bar carries its figure as a ``<title>`` (a tooltip, and what a
test reads).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from django_cogworker import metrics
from django_cogworker.admin import chart
from django_cogworker.admin.chart import GRID_LINES, MARGIN_TOP_PX, Bar, Chart, Label, Point
from django_cogworker.api.metrics import DeployMark, Minute

#: The per-minute strips are lower than the dashboard's history.
STRIP_HEIGHT_PX = 170
#: The histogram's bucket labels take two lines under the bars, every
#: other one on the lower (``STAGGER_PX`` lower).
HISTOGRAM_HEIGHT_PX = 220
STAGGER_PX = 14
#: Minute labels shown at most, whatever the hours: every 10, 15, 30 or 60 min.
MAX_MINUTE_LABELS = 8
LABEL_EVERY_MIN = (10, 15, 20, 30, 60, 120)
#: Characters of a deploy mark's label written on the chart (all of it is the tooltip).
MARK_TEXT_CHARS = 24
#: The table's histograms.
SPARK_WIDTH_PX, SPARK_HEIGHT_PX = 136, 26


@dataclass(frozen=True)
class MarkLine:
    x: float
    top: float
    bottom: float
    #: The tooltip: the label in full and the time.
    title: str
    #: What is written by the line (the label, cut short), and where: on
    #: its left when the line is in the chart's right half.
    text: str
    text_x: float
    anchor: str


@dataclass
class MarkedChart(Chart):
    marks: list[MarkLine] = field(default_factory=list)


@dataclass(frozen=True)
class Spark:
    width: int
    height: int
    bars: list[Bar]
    summary: str


def minute_label_every(count: int) -> int:
    """Minutes between two labels of a chart of ``count`` minutes."""
    return next((n for n in LABEL_EVERY_MIN if count / n <= MAX_MINUTE_LABELS), LABEL_EVERY_MIN[-1])


def hhmm(at_s: float) -> str:
    return f"{dt.datetime.fromtimestamp(at_s, dt.UTC):%H:%M}"


def _label(at_s: float, every: int) -> str:
    return hhmm(at_s) if int(at_s // 60) % every == 0 else ""


def nice_top(value: float) -> float:
    """The smallest of ..., 0.1, 0.2, 0.4, 0.8, 1, 2, 4, 8, 10... that is at
    least ``value``: its quarters (the grid lines) read as round numbers."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(s * power for s in (1, 2, 4, 8, 10) if s * power >= value * (1 - 1e-9))


def with_marks(base: Chart, start_s: float, count: int, marks: Sequence[DeployMark]) -> MarkedChart:
    """``base`` (one column per minute from ``start_s``) with a line at each
    mark that falls in its ``count`` minutes."""
    out = MarkedChart(**{f.name: getattr(base, f.name) for f in fields(Chart)})
    slot = (out.right - out.left) / max(1, count)
    end_s = start_s + 60 * count
    for mark in marks:
        if start_s <= mark.at < end_s:
            x = round(out.left + (mark.at - start_s) / 60 * slot, 1)
            when = f"{dt.datetime.fromtimestamp(mark.at, dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
            text = mark.label if len(mark.label) <= MARK_TEXT_CHARS else mark.label[:MARK_TEXT_CHARS] + "…"
            left = x > (out.left + out.right) / 2
            out.marks.append(
                MarkLine(
                    x,
                    float(MARGIN_TOP_PX),
                    out.bottom,
                    f"Deploy {mark.label} ({when})",
                    text,
                    x - 4 if left else x + 4,
                    "end" if left else "start",
                )
            )
    return out


def runs_chart(window: list[Minute], marks: Sequence[DeployMark], name: str | None = None) -> MarkedChart:
    """Runs and failures per minute of job ``name`` (of every job when None)."""
    every = minute_label_every(len(window))
    points = []
    runs_sum = failures_sum = 0
    for m in window:
        figures = list(m.jobs.values()) if name is None else [m.jobs[name]] if name in m.jobs else []
        runs, failures = sum(f.runs for f in figures), sum(f.failures for f in figures)
        runs_sum, failures_sum = runs_sum + runs, failures_sum + failures
        title = f"{hhmm(m.at)} UTC: {runs:,} runs, {failures:,} failed"
        points.append(Point(title, _label(m.at, every), runs, failures))
    base = chart.bar_chart(points, "minute", height=STRIP_HEIGHT_PX)
    if window:
        base.summary = (
            f"Runs per minute from {hhmm(window[0].at)} to {hhmm(window[-1].at)} UTC: "
            f"{runs_sum:,} runs, {failures_sum:,} failed"
        )
    return with_marks(base, window[0].at if window else 0.0, len(window), marks)


def series_chart(
    values: Sequence[float],
    titles: Sequence[str],
    labels: Sequence[str],
    *,
    css_class: str,
    value_text: Callable[[float], str],
    height: int,
    least_top: float = 0.0,
    stagger: bool = False,
) -> Chart:
    """One bar per value, the first on the left; grid lines labelled by
    ``value_text``, the top at least ``least_top``; the labels under the
    bars on two lines when ``stagger`` (every other one lower), so that
    long ones do not overlap. Each column is also a transparent bar with
    the tooltip, so a zero has one too."""
    margin_bottom = chart.MARGIN_BOTTOM_PX + (STAGGER_PX if stagger else 0)
    out = Chart(height=height, bottom=height - margin_bottom)
    if not values:
        return out
    top = nice_top(max(least_top, *values))
    plot_top = float(MARGIN_TOP_PX)
    plot_height = out.bottom - plot_top
    slot = (out.right - out.left) / len(values)
    bar_width = max(1.0, slot * 0.7)

    def y_of(value: float) -> float:
        return out.bottom - plot_height * min(value, top) / top

    for i in range(GRID_LINES + 1):
        value = top * i / GRID_LINES
        out.grid.append(Label(out.left, round(y_of(value), 1), value_text(value)))
    for index, (value, title, label) in enumerate(zip(values, titles, labels, strict=True)):
        x = out.left + index * slot
        out.bars.append(Bar(round(x, 1), plot_top, round(slot, 1), plot_height, "minute", title))
        y = y_of(value)
        bar_x = x + (slot - bar_width) / 2
        out.bars.append(
            Bar(round(bar_x, 1), round(y, 1), round(bar_width, 1), round(out.bottom - y, 1), css_class, title)
        )
        if label:
            lower = STAGGER_PX if stagger and index % 2 else 0
            out.ticks.append(Label(round(x + slot / 2, 1), out.bottom + 16 + lower, label))
    return out


def count_text(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def mean_chart(window: list[Minute], marks: Sequence[DeployMark], name: str) -> MarkedChart:
    """The mean execution time of job ``name`` per minute (no bar in a minute it did not run)."""
    every = minute_label_every(len(window))
    values, titles = [], []
    for m in window:
        figures = m.jobs.get(name)
        if figures is None or not figures.runs:
            values.append(0.0)
            titles.append(f"{hhmm(m.at)} UTC: no runs")
        else:
            values.append(figures.mean_s)
            mean = metrics.format_s(figures.mean_s)
            titles.append(f"{hhmm(m.at)} UTC: mean {mean} over {figures.runs:,} runs")
    base = series_chart(
        values,
        titles,
        [_label(m.at, every) for m in window],
        css_class="mean",
        value_text=lambda s: "0" if s == 0 else metrics.format_s(s),
        height=STRIP_HEIGHT_PX,
    )
    if window:
        first, last = hhmm(window[0].at), hhmm(window[-1].at)
        base.summary = f"Mean execution time per minute of {name}, {first} to {last} UTC"
    return with_marks(base, window[0].at if window else 0.0, len(window), marks)


def _bucket_titles(buckets: Sequence[int]) -> list[str]:
    total = sum(buckets)
    return [
        f"{metrics.bucket_label(i)}: {n:,} runs" + (f" ({100 * n / total:.0f}%)" if total else "")
        for i, n in enumerate(buckets)
    ]


def histogram_chart(buckets: Sequence[int], name: str) -> Chart:
    """Runs per execution-time bucket (``metrics.BUCKETS_S``), the fastest on the left."""
    out = series_chart(
        [float(n) for n in buckets],
        _bucket_titles(buckets),
        [metrics.bucket_label(i) for i in range(len(buckets))],
        css_class="mean",
        value_text=count_text,
        height=HISTOGRAM_HEIGHT_PX,
        least_top=4,  # whole numbers of runs on the grid lines
        stagger=True,
    )
    out.summary = f"Execution times of {name}: {sum(buckets):,} runs by bucket"
    return out


def spark(buckets: Sequence[int], name: str) -> Spark:
    """A row's histogram: one bar per bucket, no axes; each bar's tooltip its figure."""
    top = max(buckets, default=0) or 1
    slot = SPARK_WIDTH_PX / max(1, len(buckets))
    bars = []
    for i, title in enumerate(_bucket_titles(buckets)):
        height = round((SPARK_HEIGHT_PX - 2) * buckets[i] / top, 1)
        x = round(i * slot, 1)
        bars.append(Bar(x, 0.0, round(slot, 1), float(SPARK_HEIGHT_PX), "minute", title))
        bars.append(Bar(x + 0.5, SPARK_HEIGHT_PX - 1 - height, round(slot - 1, 1), height, "mean", title))
    return Spark(SPARK_WIDTH_PX, SPARK_HEIGHT_PX, bars, f"Execution times of {name} by bucket")
