"""The demo's only page: send a batch of jobs, watch the results come in."""

from __future__ import annotations

import random

import redis
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from django_cogworker.errors import CogworkerError
from testproject.demo import jobs
from testproject.demo.forms import SendJobsForm
from testproject.demo.models import JobResult

RECENT = 50


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


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
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
    context = {
        "form": form,
        "results": JobResult.objects.all()[:RECENT],
        "succeeded": JobResult.objects.filter(status=JobResult.Status.SUCCEEDED).count(),
        "failed": JobResult.objects.filter(status=JobResult.Status.FAILED).count(),
    }
    return render(request, "demo/index.html", context)
