"""What a failure becomes: a retry in the future, or an entry in dead.

The backoff is Sidekiq's polynomial with jitter, ``count**4 + 15 +
rand(10) * (count + 1)`` seconds, unless the job gives ``retry_in``.
"""

from __future__ import annotations

import logging
import random
import traceback
from typing import TYPE_CHECKING

from django_cogworker.payload import Payload

if TYPE_CHECKING:
    from django_cogworker.job import Job

logger = logging.getLogger("django_cogworker")

#: Characters of traceback kept on a payload: enough to debug, small enough
#: that 10,000 dead jobs stay a few tens of MB.
BACKTRACE_MAX_CHARS = 8000


def next_retry_count(payload: Payload) -> int:
    """The ``retry_count`` a failure of this run records, and the running
    job's ``current_job().retry_count``: 0 on the first run, one more than
    the payload's on a retry."""
    count = payload.get("retry_count")
    return int(count) + 1 if isinstance(count, int) else 0


def max_retries(payload: Payload, default_retry: int) -> int:
    value = payload.get("retry", True)
    if value is True:
        return default_retry
    if value is False or value is None:
        return 0
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default_retry


def backoff_s(count: int, exc: BaseException, job: Job | None) -> float:
    if job is not None and job.retry_in is not None:
        try:
            custom = job.retry_in(count, exc)
        except Exception:
            logger.exception("retry_in of job %s failed; using the default backoff", job.name)
        else:
            if custom is not None:
                return max(0.0, float(custom))
    return float(count**4 + 15 + random.randint(0, 9) * (count + 1))


def error_class(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


#: Attempts a payload remembers (``attempts``): the latest ones.
ATTEMPTS_KEPT = 25


def with_failure(payload: Payload, exc: BaseException, now: float, took_s: float | None = None) -> Payload:
    """The payload with this failure recorded (``retry_count`` counts from 0
    at the first failure, so an exhausted ``retry=N`` job shows N), and,
    when ``took_s`` is given, this attempt in ``attempts``: when it
    started, how long it ran, how it ended (the job page's timeline)."""
    failed = dict(payload)
    if took_s is not None:
        earlier = failed.get("attempts")
        attempt = {"started_at": round(now - took_s, 6), "ran_s": round(took_s, 6), "error": error_class(exc)}
        failed["attempts"] = [*(earlier if isinstance(earlier, list) else []), attempt][-ATTEMPTS_KEPT:]
    failed["retry_count"] = next_retry_count(payload)
    failed["error_class"] = error_class(exc)
    failed["error_message"] = str(exc)[:2000]
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    failed["error_backtrace"] = tb[-BACKTRACE_MAX_CHARS:]
    if "failed_at" in failed:
        failed["retried_at"] = now
    else:
        failed["failed_at"] = now
    return failed
