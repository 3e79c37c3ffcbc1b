"""Views a project includes in its own urls.py.

Duties: ``metrics`` answers the Prometheus text exposition format (0.0.4)
with the figures of ``api.prometheus.scrape()`` (SPEC section 12): to an
active staff session with the jobs pages' view permission (the admin's
rule: ``view_job`` or ``change_job``; superusers pass), or to
``Authorization: Bearer <METRICS_TOKEN>`` (compared in constant time);
anything else gets 403. Redis down or refusing is a short 503 naming the
address without its password, never a 500. One scrape costs a fixed
number of Redis round trips, whatever the number of job names
(``api/prometheus.py``). Like the admin pages, it calls only
``django_cogworker.api``.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from django_cogworker.api.prometheus import Scrape, scrape
from django_cogworker.conf import get_config
from django_cogworker.connection import describe
from django_cogworker.errors import PAGE_CATCHES, RedisUnavailable, redis_failure
from django_cogworker.metrics import BUCKETS_S

logger = logging.getLogger("django_cogworker")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

#: The permissions either of which shows the jobs pages (ModelAdmin's
#: ``has_view_permission``), and so the metrics.
VIEW_PERMISSIONS = ("django_cogworker.view_job", "django_cogworker.change_job")


@require_safe
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not (_staff_may_view(request) or _bearer_matches(request)):
        return HttpResponse(
            "403 Forbidden: log in as staff with the jobs' view permission, "
            "or send Authorization: Bearer <COGWORKER['METRICS_TOKEN']>.\n",
            status=403,
            content_type=TEXT,
        )
    try:
        figures = scrape()
    except PAGE_CATCHES as exc:
        error = redis_failure(exc, "read the metrics")
        if error is None:
            raise
        # redis-py's text names the host and port, never the password.
        logger.warning("metrics endpoint: %s", error)
        what = "is unreachable" if isinstance(error, RedisUnavailable) else "refused the reads"
        return HttpResponse(
            f"503 Service Unavailable: Redis {what} at {describe(get_config())}.\n",
            status=503,
            content_type=TEXT,
        )
    return HttpResponse("".join(exposition(figures)), content_type=CONTENT_TYPE)


def _staff_may_view(request: HttpRequest) -> bool:
    """The admin's rule (``admin_site.admin_view`` + ``has_view_permission``)."""
    user = getattr(request, "user", None)
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and any(user.has_perm(p) for p in VIEW_PERMISSIONS)
    )


def _bearer_matches(request: HttpRequest) -> bool:
    token = get_config().metrics_token
    if token is None:
        return False
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return False
    given = credentials.strip()
    # WSGI hands a header's bytes over decoded as latin-1 (PEP 3333): undone,
    # they compare with the token's UTF-8; compare_digest takes the same time
    # wherever they differ, so the token cannot be guessed byte by byte.
    try:
        presented = given.encode("latin-1")
    except UnicodeEncodeError:
        presented = given.encode("utf-8")
    return hmac.compare_digest(presented, token.encode("utf-8"))


# -- the text exposition format, version 0.0.4 ------------------------------------------


def exposition(s: Scrape) -> Iterator[str]:
    """The lines of one scrape, each family with its ``# HELP`` and ``# TYPE``."""
    yield from _family("cogworker_processed_total", "counter", "Jobs run to an end, failures included.")
    yield _sample("cogworker_processed_total", {}, s.processed)
    yield from _family(
        "cogworker_failed_total",
        "counter",
        "Failed runs (retried, dead or dropped), unrunnable payloads included.",
    )
    yield _sample("cogworker_failed_total", {}, s.failed)

    yield from _family("cogworker_queue_size", "gauge", "Jobs waiting in the queue.")
    for q in s.queues:
        yield _sample("cogworker_queue_size", {"queue": q.name}, q.size)
    yield from _family(
        "cogworker_queue_latency_seconds", "gauge", "How long the queue's oldest job has waited."
    )
    for q in s.queues:
        yield _sample("cogworker_queue_latency_seconds", {"queue": q.name}, q.latency_s)

    for name, help_text, value in (
        ("cogworker_retry_size", "Jobs waiting for a retry.", s.retry_size),
        ("cogworker_dead_size", "Jobs in the dead set.", s.dead_size),
        ("cogworker_scheduled_size", "Jobs scheduled for later.", s.scheduled_size),
        ("cogworker_unsettled_size", "Failed jobs a stopping worker could not file yet.", s.unsettled_size),
        ("cogworker_processes", "Live worker processes.", s.processes),
        ("cogworker_busy_threads", "Threads running a job, over the live processes.", s.busy_threads),
    ):
        yield from _family(name, "gauge", help_text)
        yield _sample(name, {}, value)

    yield from _family("cogworker_expired_total", "counter", "Jobs dropped unrun past their deadline.")
    for name in sorted(s.expired):
        yield _sample("cogworker_expired_total", {"job": name}, s.expired[name])

    yield from _family(
        "cogworker_limit_holders", "gauge", "Jobs holding a limiter's slot; a rate's starts in its window."
    )
    for limit in s.limits:
        yield _sample("cogworker_limit_holders", {"limit": limit.name}, limit.holders)
    yield from _family("cogworker_limit_waiting", "gauge", "Jobs waiting for a limiter.")
    for limit in s.limits:
        yield _sample("cogworker_limit_waiting", {"limit": limit.name}, limit.waiting)

    yield from _family("cogworker_batches_open", "gauge", "Batches not settled yet.")
    yield _sample("cogworker_batches_open", {}, s.batches_open)
    yield from _family("cogworker_batch_callbacks_total", "counter", "Batch callbacks enqueued, by event.")
    for event, count in s.batch_callbacks.items():
        yield _sample("cogworker_batch_callbacks_total", {"event": event}, count)

    jobs = sorted(s.jobs.values(), key=lambda f: f.name)
    runs = "cogworker_job_runs_total"
    yield from _family(runs, "counter", "Runs of each job, by outcome.")
    for f in jobs:
        yield _sample(runs, {"job": f.name, "outcome": "success"}, max(0, f.runs - f.failures))
        yield _sample(runs, {"job": f.name, "outcome": "failure"}, f.failures)
    name = "cogworker_job_duration_seconds"
    yield from _family(name, "histogram", "Execution time of each job.")
    for f in jobs:
        # The +Inf bucket and _count both from the buckets (not the runs
        # field), so that they agree as the format requires even when a
        # field of the hash was malformed and skipped.
        seen = 0
        for bound, n in zip(BUCKETS_S, f.buckets, strict=False):
            seen += n
            yield _sample(f"{name}_bucket", {"job": f.name, "le": _value(bound)}, seen)
        count = sum(f.buckets)
        yield _sample(f"{name}_bucket", {"job": f.name, "le": "+Inf"}, count)
        yield _sample(f"{name}_sum", {"job": f.name}, f.total_s)
        yield _sample(f"{name}_count", {"job": f.name}, count)


def _family(name: str, kind: str, help_text: str) -> Iterator[str]:
    yield f"# HELP {name} {help_text}\n"
    yield f"# TYPE {name} {kind}\n"


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    if not labels:
        return f"{name} {_value(value)}\n"
    pairs = ",".join(f'{key}="{escape(text)}"' for key, text in labels.items())
    return f"{name}{{{pairs}}} {_value(value)}\n"


def escape(label_value: str) -> str:
    """A label value as the format quotes it: backslash, double quote and
    newline escaped (in that order: the backslashes added are not doubled)."""
    return label_value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
