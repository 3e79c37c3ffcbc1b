"""What one scrape of the Prometheus endpoint (``views.metrics``) reads.

Duties: ``scrape()`` gathers every figure the endpoint exposes through the
inspection API (``Stats``, ``Queue.all()``, ``ProcessSet``,
``api.metrics.totals()``) in a fixed number of round trips, whatever the
number of job names, queues or processes: seven (two for ``Stats``, one
for ``Queue.all()``, one for the queues' figures, two for the processes,
one for the job totals). ``queue_figures()`` reads the size and latency
of many queues in one pipelined round trip, where ``Queue.size`` and
``Queue.latency`` cost two per queue. A key of the wrong type reads as
empty, as in ``Queue``; Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from django_cogworker.api import metrics as job_metrics
from django_cogworker.api.parsing import is_wrong_type
from django_cogworker.api.processes import ProcessSet
from django_cogworker.api.queues import Queue, wait_s
from django_cogworker.api.stats import Stats
from django_cogworker.connection import get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.metrics import JobFigures


@dataclass(frozen=True)
class QueueFigures:
    name: str
    size: int
    #: How long its oldest job has waited (s); 0 when empty.
    latency_s: float


@dataclass(frozen=True)
class Scrape:
    processed: int
    failed: int
    scheduled_size: int
    retry_size: int
    dead_size: int
    unsettled_size: int
    #: Every queue of ``Queue.all()``, by name.
    queues: list[QueueFigures]
    #: Live processes, and the threads running a job in them.
    processes: int
    busy_threads: int
    #: Cumulative figures per job name (``N:metrics:totals``).
    jobs: dict[str, JobFigures]


@redis_boundary("read the queues' sizes and latencies")
def queue_figures(queues: Iterable[Queue], *, now: float | None = None) -> list[QueueFigures]:
    """Size and latency of each of ``queues``, in one pipelined round trip."""
    queues = list(queues)
    pipe = get_redis().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue.key)
        pipe.lindex(queue.key, -1)
    replies = pipe.execute(raise_on_error=False)
    now = time.time() if now is None else now
    out = []
    for i, queue in enumerate(queues):
        size, oldest = replies[2 * i], replies[2 * i + 1]
        # Not a list: empty (``Stats`` notes it); any other error is raised.
        size = 0 if is_wrong_type(size) else int(size)
        oldest = None if is_wrong_type(oldest) else oldest
        out.append(QueueFigures(queue.name, size, wait_s(oldest, now)))
    return out


def scrape() -> Scrape:
    stats = Stats()
    queues = queue_figures(Queue.all())
    processes = ProcessSet().all()
    return Scrape(
        processed=stats.processed,
        failed=stats.failed,
        scheduled_size=stats.scheduled_size,
        retry_size=stats.retry_size,
        dead_size=stats.dead_size,
        unsettled_size=stats.unsettled_size,
        queues=queues,
        processes=len(processes),
        busy_threads=sum(p.busy for p in processes),
        jobs=job_metrics.totals().jobs,
    )
