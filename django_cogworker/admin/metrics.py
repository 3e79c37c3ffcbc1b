"""The metrics tab (SPEC section 12), as Sidekiq 7's: per job name over the
last hour (or 2, 4, 8: ``metrics.HOURS``), its runs, failures, total and
mean execution time, p50/p95/p99 estimated from its histogram, and the
histogram itself; sorted by total time (the default), runs, failures or
mean, most first; 25 names a page (``?p=``), filtered by a text the name
holds (``?q=``): every name is summed and sorted, only a page's rows are
drawn. Each name leads to its own page: runs and failures per
minute, mean time per minute and its histogram. A dashed line marks each
deploy in range (``api.mark_deploy``). Read only.

A job name is untrusted text (what a payload said): it reaches the
templates as data, escaped there, and travels in a URL as one
percent-encoded path segment (``helpers.segment``). The API skips malformed
fields and counts them; the page says how many, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse

from django_cogworker import api, metrics
from django_cogworker.admin import metrics_chart
from django_cogworker.admin.display import duration_text, malformed_notes
from django_cogworker.admin.helpers import (
    admin_url,
    context,
    page_by_name,
    page_links,
    render,
    require_view,
    segment,
    unsegment,
)
from django_cogworker.api import metrics as job_metrics
from django_cogworker.metrics import JobFigures

#: ``?sort=``: the columns the table may be sorted by (most first), in the
#: table's order, with their headings.
SORTS: dict[str, tuple[str, Callable[[JobFigures], float]]] = {
    "runs": ("Runs", lambda f: f.runs),
    "failures": ("Failures", lambda f: f.failures),
    "total": ("Total time", lambda f: f.time_us),
    "mean": ("Mean", lambda f: f.mean_s),
}
DEFAULT_SORT = "total"

#: The quantiles shown, as estimated from the histogram.
PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def chosen_hours(request: HttpRequest) -> int:
    """``?hours=``, one of ``metrics.HOURS``; anything else is the first."""
    try:
        hours = int(request.GET.get("hours", ""))
    except ValueError:
        return metrics.HOURS[0]
    return hours if hours in metrics.HOURS else metrics.HOURS[0]


def chosen_sort(request: HttpRequest) -> str:
    sort = request.GET.get("sort", DEFAULT_SORT)
    return sort if sort in SORTS else DEFAULT_SORT


def time_text(seconds: float) -> str:
    """``12.5 ms``, ``3.2 s``, then ``4 min 10 s``, ``2 h 5 min``."""
    return metrics.format_s(seconds) if seconds < 60 else duration_text(seconds)


@dataclass(frozen=True)
class Figures:
    """One job's figures as the pages show them."""

    name: str
    runs: int
    failures: int
    total: str
    mean: str
    percentiles: list[tuple[str, str]]


def figures_of(f: JobFigures) -> Figures:
    return Figures(
        f.name,
        f.runs,
        f.failures,
        time_text(f.total_s),
        time_text(f.mean_s),
        [(label, time_text(f.percentile(q))) for label, q in PERCENTILES],
    )


@dataclass(frozen=True)
class JobRow:
    figures: Figures
    url: str
    spark: metrics_chart.Spark


def job_rows(model_admin: ModelAdmin, page: list[JobFigures], hours: int) -> list[JobRow]:
    """The rows of one page of the table: the percentiles and the histogram
    of 10,000 job names would take 30 s to draw, and 40 MB to send."""
    return [
        JobRow(
            figures_of(f),
            admin_url(model_admin, "job_metrics", segment(f.name)) + f"?hours={hours}",
            metrics_chart.spark(f.buckets, f.name),
        )
        for f in page
    ]


def window_of(hours: int) -> tuple[list[job_metrics.Minute], list[api.DeployMark], list[str]]:
    """The minutes of the last ``hours``, the deploy marks among them, and
    the notes on what was malformed."""
    window = job_metrics.minutes(hours)
    marks = api.deploy_marks(window[0].at, window[-1].at + 60)
    skipped = sum(m.malformed for m in window)
    notes = []
    if skipped:
        notes.append(
            f"{skipped:,} field{'s' if skipped != 1 else ''} of the metrics hashes "
            "skipped (not <job>|<kind>, or not a whole number)"
        )
    return window, list(marks), malformed_notes(notes, marks.skipped)


def query(hours: int, sort: str, search: str) -> str:
    """The link to page 1 of the table with these choices."""
    return "?" + urlencode({"hours": hours, "sort": sort, **({"q": search} if search else {})})


def metrics_page(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    hours, sort = chosen_hours(request), chosen_sort(request)
    window, marks, notes = window_of(hours)
    jobs = job_metrics.summed(window)
    key = SORTS[sort][1]
    # Sorting every name is cheap; drawing a row is not: only a page's are.
    search, page = page_by_name(request, sorted(jobs.values(), key=lambda f: (-key(f), f.name)))
    ctx = context(
        request,
        model_admin,
        title="Metrics",
        tab="metrics",
        hours=hours,
        hours_links=[(h, query(h, sort, search), h == hours) for h in metrics.HOURS],
        sort=sort,
        sort_links=[(k, label, query(hours, k, search), k == sort) for k, (label, _) in SORTS.items()],
        search=search,
        show_all_url=query(hours, sort, ""),
        job_names=len(jobs),
        page=page,
        page_links=page_links(page),
        rows=job_rows(model_admin, list(page.object_list), hours),
        runs=sum(f.runs for f in jobs.values()),
        failures=sum(f.failures for f in jobs.values()),
        runs_chart=metrics_chart.runs_chart(window, marks),
        malformed_notes=notes,
    )
    return render(request, model_admin, "metrics.html", ctx)


def job_page(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_view(request, model_admin)
    job = unsegment(name)
    hours = chosen_hours(request)
    window, marks, notes = window_of(hours)
    figures = JobFigures(job)
    for m in window:
        if job in m.jobs:
            figures.add(m.jobs[job])
    ctx = context(
        request,
        model_admin,
        title=f"Metrics of {job}",
        tab="metrics",
        crumbs=[(job, None)],
        job=job,
        hours=hours,
        hours_links=[(h, f"?hours={h}", h == hours) for h in metrics.HOURS],
        figures=figures_of(figures),
        runs_chart=metrics_chart.runs_chart(window, marks, job),
        mean_chart=metrics_chart.mean_chart(window, marks, job),
        histogram=metrics_chart.histogram_chart(figures.buckets, job),
        malformed_notes=notes,
    )
    return render(request, model_admin, "metrics_job.html", ctx)
