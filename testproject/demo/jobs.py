"""Demo jobs: each records how it ended in a ``JobResult``."""

from __future__ import annotations

import random
import time

from django_cogworker import current_job, job
from testproject.demo.models import JobResult

#: ``slow`` never sleeps longer than this, whatever it is asked.
MAX_SLOW_SECONDS = 30.0


class DemoFailure(Exception):
    """Raised on purpose by the failing demo jobs."""


def _record(status: str, detail: str) -> None:
    context = current_job()
    if context is None:  # a plain call, ``add(1, 2)``, runs outside any worker
        JobResult.objects.create(jid="inline", job="inline", status=status, detail=detail)
        return
    if context.retry_count:
        detail = f"{detail} (retry {context.retry_count})"
    JobResult.objects.create(jid=context.jid, job=context.name, status=status, detail=detail)


@job
def add(a: float, b: float) -> float:
    total = a + b
    _record(JobResult.Status.SUCCEEDED, f"{a} + {b} = {total}")
    return total


@job(queue="low")
def slow(seconds: float) -> None:
    seconds = min(max(float(seconds), 0.0), MAX_SLOW_SECONDS)
    time.sleep(seconds)
    _record(JobResult.Status.SUCCEEDED, f"slept {seconds:.1f} s")


@job(retry=2, retry_in=lambda count, exc: 2)
def flaky(fail_ratio: float) -> None:
    if random.random() < fail_ratio:
        _record(JobResult.Status.FAILED, f"failed at random (fail ratio {fail_ratio:.0%})")
        raise DemoFailure(f"flaky failed at random (fail ratio {fail_ratio:.0%})")
    _record(JobResult.Status.SUCCEEDED, f"lucky this time (fail ratio {fail_ratio:.0%})")


@job(retry=0)
def always_fails(message: str) -> None:
    _record(JobResult.Status.FAILED, message)
    raise DemoFailure(message)


@job
def note(text: str) -> None:
    """Records ``text``: the demo's periodic entry and scheduled jobs run it."""
    _record(JobResult.Status.SUCCEEDED, text)
