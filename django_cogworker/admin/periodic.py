"""The periodic tab: every periodic entry this process knows, with its
arguments, cron and time zone, queue, next run, last run, and whether a
run holds its ``until_executed`` lock. Read only."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse

from django_cogworker import api
from django_cogworker.admin.display import When, json_line, malformed_notes
from django_cogworker.admin.helpers import context, render, require_view


@dataclass(frozen=True)
class PeriodicRow:
    name: str
    args: str
    cron: str
    tz: str
    queue: str
    next_run: When | None
    last_run: When | None
    running: bool


def periodic_rows(entries: list[api.PeriodicEntry]) -> list[PeriodicRow]:
    return [
        PeriodicRow(
            name=entry.job,
            args=json_line(entry.args, entry.kwargs),
            cron=entry.cron,
            tz=entry.tz,
            queue=entry.queue,
            next_run=When.of(entry.next_run.timestamp()),
            last_run=None if entry.last_run is None else When.of(entry.last_run.timestamp()),
            running=entry.running,
        )
        for entry in entries
    ]


def periodic(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    entries = api.PeriodicEntries().all()
    ctx = context(
        request,
        model_admin,
        title="Periodic jobs",
        tab="periodic",
        entries=periodic_rows(entries),
        malformed_notes=malformed_notes(entries.skipped),
    )
    return render(request, model_admin, "periodic.html", ctx)
