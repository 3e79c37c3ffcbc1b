"""The busy tab: live processes and the jobs running in them, the page of
one running job (whole, from its process's in-progress list; no actions:
the job is its process's alone while it runs, G2), and the quiet and stop
signals (a POST each), which a process acts on at its next beat."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.text import Truncator
from django.views.decorators.http import require_POST

from django_cogworker import api
from django_cogworker.admin.display import When, duration_text, job_details, malformed_notes
from django_cogworker.admin.helpers import (
    REFRESH_CHOICES_S,
    admin_url,
    context,
    process_rows,
    render,
    require_change,
    require_view,
    segment,
    unsegment,
)


@dataclass(frozen=True)
class RunningRow:
    job: api.RunningJob
    args: str
    started: When | None
    running_for: str
    url: str | None  # its page, when its jid could be read


def running_url(model_admin: ModelAdmin, job: api.RunningJob) -> str | None:
    if not job.jid or job.unreadable:
        return None
    return admin_url(model_admin, "running_job", segment(job.identity), segment(job.jid))


def running_row(model_admin: ModelAdmin, job: api.RunningJob) -> RunningRow:
    # A start of 0 is one that could not be read (missing or malformed):
    # not "running for 20,000 days".
    started = job.run_at > 0
    return RunningRow(
        job,
        job.args_preview,
        When.of(job.run_at) if started else None,
        duration_text(job.running_for_s) if started else "",
        running_url(model_admin, job),
    )


def busy(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    workers = api.Workers().all()
    running = [running_row(model_admin, j) for j in workers]
    ctx = context(
        request,
        model_admin,
        title="Busy",
        tab="busy",
        running=running,
        signal_url=admin_url(model_admin, "busy_signal"),
        refresh_choices=REFRESH_CHOICES_S,
    )
    ctx["process_rows"] = process_rows(ctx["processes"])
    ctx["malformed_notes"] = malformed_notes(ctx["processes"].skipped, workers.skipped)
    return render(request, model_admin, "busy.html", ctx)


def running_job(request: HttpRequest, model_admin: ModelAdmin, identity: str, jid: str) -> HttpResponse:
    """A job running now, whole, from its process's in-progress list (the
    busy page has only the summary its heartbeat records). No actions: the
    job is its process's alone while it runs (G2)."""
    require_view(request, model_admin)
    identity, jid = unsegment(identity), unsegment(jid)
    record = api.InProgress(identity).find(jid)
    if record is None:
        messages.warning(
            request, f"Job {jid} is no longer running on {identity}: it finished, or was put back."
        )
        return HttpResponseRedirect(admin_url(model_admin, "busy"))
    times = [("Created", When.of(record.created_at)), ("Enqueued", When.of(record.enqueued_at))]
    short_jid = Truncator(record.jid).chars(40)
    ctx = context(
        request,
        model_admin,
        title=f"Running job {short_jid}",
        tab="busy",
        crumbs=[(short_jid, None)],
        times=[(label, w) for label, w in times if w is not None],
        running_on=identity,
        actions=[],
        **job_details(record),
    )
    return render(request, model_admin, "job.html", ctx)


@require_POST
def busy_signal(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_change(request, model_admin)
    what = request.POST.get("signal", "")
    identity = request.POST.get("identity", "")
    if what not in ("quiet", "stop"):
        messages.error(request, "Unknown signal.")
        return HttpResponseRedirect(admin_url(model_admin, "busy"))
    live = [p.identity for p in api.ProcessSet().all()]
    targets = live if identity == "*" else [i for i in live if i == identity]
    for target in targets:
        api.ProcessSet.signal(target, what)
    if targets:
        verb = "stop fetching" if what == "quiet" else "stop"
        messages.success(
            request,
            f"Sent {what} to {', '.join(targets)}: a process acts on it at its next beat (it will {verb}).",
        )
    else:
        messages.warning(request, "No such live process: it may have stopped already.")
    return HttpResponseRedirect(admin_url(model_admin, "busy"))
