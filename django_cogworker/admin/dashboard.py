"""The dashboard tab: the processed and failed totals, and the expired one
once a job has expired (SPEC section 14); processed/failed charts (per
minute over the last hour, per day over the chosen range), the sizes and
latency of the largest queues, live processes (SPEC section 7); a note when
Redis is full (section 8). Read only."""

from __future__ import annotations

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse

from django_cogworker import api
from django_cogworker.admin import chart
from django_cogworker.admin.display import malformed_notes
from django_cogworker.admin.helpers import (
    REFRESH_CHOICES_S,
    context,
    process_rows,
    queue_rows,
    render,
    require_view,
)
from django_cogworker.errors import full_message

#: Day ranges offered by the dashboard's history chart.
HISTORY_DAYS = (7, 30, 90)

#: Queues listed on the dashboard: the largest.
DASHBOARD_QUEUES = 10

#: Minutes drawn by the last hour's chart.
LAST_HOUR_MINUTES = 60


def dashboard(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    try:
        days = int(request.GET.get("days", "30"))
    except ValueError:
        days = 30
    if days not in HISTORY_DAYS:
        days = 30
    history = api.Stats.history(days)
    minutes = api.Stats.per_minute(LAST_HOUR_MINUTES)
    listed = api.Queue.all()
    ctx = context(
        request,
        model_admin,
        title="Jobs dashboard",
        tab="dashboard",
        days=days,
        history_days=HISTORY_DAYS,
        chart=chart.history_chart(history),
        history_processed=sum(p for _, p, _ in history),
        history_failed=sum(f for _, _, f in history),
        minute_chart=chart.minute_chart(minutes),
        minute_processed=sum(p for _, p, _ in minutes),
        minute_failed=sum(f for _, _, f in minutes),
        refresh_choices=REFRESH_CHOICES_S,
    )
    # The largest queues, their sizes already read by Stats: the figures and
    # rows of 20,000 queues took 11 s (the Queues page lists them all).
    sizes = ctx["stats"].queue_sizes
    largest = sorted(listed, key=lambda q: (-sizes.get(q.name, 0), q.name))[:DASHBOARD_QUEUES]
    ctx["queues"] = queue_rows(model_admin, largest)
    ctx["queue_count"] = len(listed)
    ctx["persistence_note"] = api.persistence_note()
    found = api.memory()
    ctx["full"] = full_message(found.used_bytes, found.maxmemory_bytes) if found and found.full else ""
    ctx["process_rows"] = process_rows(ctx["processes"])
    ctx["busy"] = sum(p.busy for p in ctx["processes"])
    ctx["threads"] = sum(p.concurrency for p in ctx["processes"])
    stats = ctx["stats"]
    ctx["malformed_notes"] = malformed_notes(
        stats.malformed.values(),
        stats.skipped,
        ctx["processes"].skipped,
        listed.skipped,
        history.skipped,
    )
    return render(request, model_admin, "dashboard.html", ctx)
