"""The demo's only page: send a batch of jobs, watch the results come in."""

from __future__ import annotations

import random
from datetime import timedelta

import redis
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from django_cogworker import api
from django_cogworker.errors import CogworkerError
from testproject.demo import jobs
from testproject.demo.forms import SendJobsForm
from testproject.demo.models import JobResult

#: How many results the table shows (the newest).
RECENT = 50
#: How far ahead the "Schedule a job" button puts its job.
SCHEDULE_IN = 60
#: How often the page reloads the results while jobs are pending (milliseconds).
REFRESH_MS = 3000


def send_jobs(count: int, failing_percent: int, slow_percent: int) -> dict[str, int]:
    """Enqueue ``count`` demo jobs in the given proportions; returns how many of each."""
    failing = round(count * failing_percent / 100)
    slow = min(round(count * slow_percent / 100), count - failing)
    kinds = ["failing"] * failing + ["slow"] * slow + ["add"] * (count - failing - slow)
    random.shuffle(kinds)
    sent = {"add": 0, "slow": 0, "flaky": 0, "always_fails": 0}
    for number, kind in enumerate(kinds, start=1):
        if kind == "slow":
            jobs.slow.delay(round(random.uniform(1, 10), 1))
            sent["slow"] += 1
        elif kind == "failing" and number % 2:
            jobs.always_fails.delay(f"demo job #{number} fails on purpose")
            sent["always_fails"] += 1
        elif kind == "failing":
            jobs.flaky.delay(0.7)
            sent["flaky"] += 1
        else:
            jobs.add.delay(number, random.randint(1, 100))
            sent["add"] += 1
    return sent


def schedule_note(seconds: int = SCHEDULE_IN) -> str | None:
    """Put one ``note`` job in the scheduled set, due in ``seconds``; its jid."""
    now = timezone.now()
    due = now + timedelta(seconds=seconds)
    return jobs.note.delay_in(
        seconds, f"scheduled job: put at {now:%H:%M:%S} with delay_in({seconds}), due {due:%H:%M:%S}"
    )


def pending_jobs() -> dict[str, int] | None:
    """Jobs not finished yet, by where they are; None when Redis does not answer."""
    try:
        running = 0
        for process in api.ProcessSet().all():
            # Reliable fetch keeps each running job in the process's in-progress
            # list; basic fetch has none, only the count of its last heartbeat.
            running += process.busy if process.fetch == "basic" else api.InProgress(process.identity).size
        return {
            "queued": sum(queue.size for queue in api.Queue.all()),
            "running": running,
            "retrying": api.RetrySet().size,
            "scheduled": api.ScheduledSet().size,
        }
    except (CogworkerError, redis.RedisError):
        return None


def results_context() -> dict[str, object]:
    """What the results card shows. Its summary counts the rows of the table
    (the newest ``RECENT``) and says how many there are in all."""
    results = list(JobResult.objects.all()[:RECENT])
    succeeded = sum(r.status == JobResult.Status.SUCCEEDED for r in results)
    pending = pending_jobs()
    return {
        "results": results,
        "total": JobResult.objects.count(),
        "succeeded": succeeded,
        "failed": len(results) - succeeded,
        "pending": pending,
        "pending_total": sum(pending.values()) if pending else 0,
        "refresh_ms": REFRESH_MS,
        "refresh_s": REFRESH_MS // 1000,
    }


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    if request.method == "POST" and request.POST.get("action") == "schedule":
        try:
            jid = schedule_note()
        except (CogworkerError, redis.RedisError) as exc:
            messages.error(request, f"Could not schedule: {exc}")
        else:
            messages.success(
                request,
                f"Scheduled job {jid}: it runs in {SCHEDULE_IN} s, and waits on the admin's Scheduled page "
                "until then.",
            )
        return redirect("index")
    if request.method == "POST":
        form = SendJobsForm(request.POST)
        if form.is_valid():
            try:
                sent = send_jobs(**form.cleaned_data)
            except (CogworkerError, redis.RedisError) as exc:
                messages.error(request, f"Could not enqueue: {exc}")
            else:
                summary = ", ".join(f"{n} {name}" for name, n in sent.items() if n)
                messages.success(request, f"Sent {sum(sent.values())} jobs: {summary}.")
            return redirect("index")
    else:
        form = SendJobsForm()
    if request.GET.get("part") == "results":  # what the page's refresh script fetches
        return render(request, "demo/_results.html", results_context())
    context = {"form": form, "schedule_in": SCHEDULE_IN, **results_context()}
    return render(request, "demo/index.html", context)
