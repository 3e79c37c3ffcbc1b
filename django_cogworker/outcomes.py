"""How a run ends: the :class:`Outcome` of one job, and what a failure becomes.

Duties: decide the outcome of a failed run, whichever runner ran it (a
processor thread, the event loop of ``async def`` jobs, the testing
helpers): its retry (``retry.py``), its filing in dead, its error handlers
and its ``on_exhausted``, an expiring job's drop when its retry would come
too late, and its one WARNING line; a payload that cannot run filed in dead
whole (G13); a run past its ``hard_timeout`` filed as a failure.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from django_cogworker import expiry, middleware, registry, retry
from django_cogworker.conf import Config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import JobTimeout
from django_cogworker.payload import Payload, encode_stored, salvage

if TYPE_CHECKING:
    from django_cogworker.job import Job

logger = logging.getLogger("django_cogworker")

ACK = "ack"  # finished (or dropped): take it off the in-progress list
RETRY = "retry"
DEAD = "dead"
#: Met a full limiter in its code (errors.OverLimit): parked, to run again
#: from its start; neither processed nor failed.
WAIT = "wait"


@dataclass
class Outcome:
    kind: str  # ACK, RETRY, DEAD or WAIT
    payload: Payload | None = None  # what to file (RETRY, DEAD)
    score: float = 0.0
    #: None: the job did not run (it expired): neither processed nor failed.
    failed: bool | None = False
    jid: str = ""
    #: The job's name and how long its function ran (s), when it was called.
    ran: tuple[str, float] | None = None
    #: A KeyboardInterrupt in the main thread: the caller re-raises it once
    #: it has applied the outcome.
    interrupted: BaseException | None = None
    #: WAIT: the full limiter (a ``limits.Limiter``).
    waits_for: Any = None
    #: The payload of a workflow's job (SPEC section 13): its end is sent at
    #: once, with its effects (``workflows/effects.py``); None for any other.
    workflow: Payload | None = None
    #: A chord member's or chain step's return value, as JSON.
    result: str | None = None
    #: Dropped as expired (``expiry.drop``): a batch counts it as succeeded.
    expired: bool = False

    def encoded(self) -> bytes:
        assert self.payload is not None
        return encode_stored(self.payload)


def dead_letter(raw: bytes, error: BaseException, now: float) -> Outcome:
    """G13: a payload that cannot run, kept whole for a person to look at."""
    entry = salvage(raw)
    entry.update(
        error_class=retry.error_class(error),
        error_message=str(error),
        failed_at=now,
    )
    logger.error("filed unrunnable payload jid=%s in dead: %s", entry["jid"], error)
    return Outcome(DEAD, entry, now, failed=True, jid=entry["jid"])


SUCCESS = middleware.Result(middleware.SUCCESS)
WAITING = middleware.Result(middleware.WAITING)


def result_of(outcome: Outcome, exc: BaseException) -> middleware.Result:
    if outcome.kind == RETRY:
        return middleware.Result(middleware.RETRY, exc, outcome.score)
    if outcome.kind == DEAD:
        return middleware.Result(middleware.DEAD, exc)
    return middleware.Result(middleware.DROPPED, exc)


def failure(payload: Payload, exc: BaseException, config: Config, job: Job, took_s: float) -> Outcome:
    """The outcome of a failed run, and its one WARNING line: the job, its
    jid, the exception's class and message, what happens next. The
    traceback, for the console, follows the last attempt's line; a retry's
    goes in a line of its own at INFO (``-v 0`` leaves it out)."""
    now = time.time()
    failed = retry.with_failure(payload, exc, now, took_s)
    count = failed["retry_count"]
    jid = failed.get("jid", "")
    ran = (job.name, took_s)
    call_error_handlers(exc, failed, config)
    what = f"failed ({failed['error_class']}: {failed['error_message'][:500]}) after {took_s:.3f}s"
    if count < retry.max_retries(failed, config.default_retry):
        delay = retry.backoff_s(count, exc, job)
        if expiry.FIELD in failed and _retry_too_late(failed, delay):
            logger.warning("jid=%s %s %s; its retry would come after its deadline", jid, failed["job"], what)
            # The middleware releases its lock (final).
            return Outcome(ACK, failed=True, jid=jid, ran=ran, expired=True)
        logger.warning("jid=%s %s %s; retry %d in %.1fs", jid, failed["job"], what, count + 1, delay)
        logger.info("jid=%s %s traceback of attempt %d:", jid, failed["job"], count + 1, exc_info=exc)
        return Outcome(RETRY, failed, now + delay, failed=True, jid=jid, ran=ran)
    if job.on_exhausted is not None:
        try:
            job.on_exhausted(failed, exc)
        except Exception:
            logger.exception("on_exhausted of job %s failed", failed["job"])
    if failed.get("dead", True) is False:
        logger.warning(
            "jid=%s %s %s; exhausted its retries; dropped (dead=False)",
            jid,
            failed["job"],
            what,
            exc_info=exc,
        )
        return Outcome(ACK, failed=True, jid=jid, ran=ran)
    logger.warning(
        "jid=%s %s %s; exhausted its retries; moved to dead", jid, failed["job"], what, exc_info=exc
    )
    return Outcome(DEAD, failed, now, failed=True, jid=jid, ran=ran)


def limit_failed(payload: Payload, exc: Exception, config: Config) -> Outcome:
    """The outcome of a job whose limit, computed from its arguments
    (``@job(limit=callable)``), raised or was not a limiter: its failure,
    like any other (retry, dead)."""
    job = registry.get(payload["job"])
    assert job is not None  # its limit was read from it
    return failure(dict(payload), exc, config, job, 0.0)


def hard_timed_out(payload: Payload, config: Config, hard_timeout_s: float, took_s: float) -> Outcome:
    """The outcome of a run still stuck past its ``hard_timeout``, filed by
    its process before it exits: a failure like any other (retry, dead)."""
    job = registry.get(payload["job"])
    assert job is not None  # it ran
    error = JobTimeout(f"job exceeded its hard_timeout of {hard_timeout_s:g}s and was still running")
    return failure(dict(payload), error, config, job, took_s)


def _retry_too_late(failed: Payload, delay_s: float) -> bool:
    """An expiring job's retry due after its deadline is dropped as expired
    (recorded here), not filed; when Redis's time cannot be told, it is filed."""
    client, keys = get_redis(), get_keys()
    try:
        late = expiry.too_late(failed, client, delay_s)
    except Exception as exc:
        logger.warning("could not read Redis's time (%s); filing the retry", exc)
        return False
    if late:
        expiry.drop(client, keys, [failed], "its retry would be due too late", unlock=False)
    return late


def call_error_handlers(exc: BaseException, payload: Payload, config: Config) -> None:
    context = {
        "jid": payload.get("jid"),
        "job": payload.get("job"),
        "queue": payload.get("queue"),
        "retry_count": payload.get("retry_count"),
        "payload": payload,
    }
    for path in config.error_handlers:
        try:
            import_string(path)(exc, context)
        except Exception:
            logger.exception("error handler %s failed", path)
