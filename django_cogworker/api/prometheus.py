"""What one scrape of the Prometheus endpoint (``views.metrics``) reads.

Duties: ``scrape()`` gathers every figure the endpoint exposes through the
inspection API (``Stats``, ``Queue.all()``, ``ProcessSet``,
``api.metrics.totals()``, ``Limit.all()``) in a fixed number of round
trips, whatever the number of job names, queues, processes, limiters or
batches: eleven, twelve when a rate limiter is known (two for ``Stats``,
one for ``Queue.all()``, one for the queues' figures, two for the
processes, one for the job totals, one for ``Limit.all()``, two for the
limiters' figures and one for the batches', plus Redis's clock for a
rate's window; the queues' figures come
from ``api.queues.queue_figures``, the limiters' from
``api.limits.limit_figures``, pipelined for them all).
Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django_cogworker.api import metrics as job_metrics
from django_cogworker.api.batches import batch_metrics
from django_cogworker.api.limits import Limit, LimitFigures, limit_figures
from django_cogworker.api.processes import ProcessSet
from django_cogworker.api.queues import Queue, QueueFigures, queue_figures
from django_cogworker.api.stats import Stats
from django_cogworker.metrics import JobFigures


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
    #: Jobs dropped unrun past their deadline (``expires``), by job name.
    expired: dict[str, int]
    #: Every limiter of the registry, by name.
    limits: list[LimitFigures]
    #: Open batches, and the callbacks enqueued so far by event (SPEC 13).
    batches_open: int
    batch_callbacks: dict[str, int]


def scrape() -> Scrape:
    stats = Stats()
    queues = queue_figures(Queue.all())
    processes = ProcessSet().all()
    batches_open, batch_callbacks = batch_metrics()
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
        expired=stats.expired_by_job,
        limits=limit_figures(Limit.all()),
        batches_open=batches_open,
        batch_callbacks=batch_callbacks,
    )
