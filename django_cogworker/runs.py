"""The steps every runner of a job shares: a thread's (``execution.py``) and
the event loop's (``arun.py``).

Duties: find the job a payload names and build its context
(:func:`begin`; a payload that cannot run is filed in dead, G13); tell the
server middleware how a run ended and return its outcome (:func:`failed`,
:func:`succeeded`; what a failure becomes is decided in ``outcomes.py``);
know whether a thread has opened a database connection, so that one that
never did is not asked to close any (G14).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections

from django_cogworker import middleware, registry, retry
from django_cogworker.conf import Config
from django_cogworker.context import JobContext, TimedJobContext
from django_cogworker.errors import BadPayload, JobNotRegistered, OverLimit
from django_cogworker.outcomes import ACK, SUCCESS, WAIT, WAITING, Outcome, dead_letter, failure, result_of
from django_cogworker.payload import Payload, decode
from django_cogworker.workflows import effects

if TYPE_CHECKING:
    from django_cogworker.job import Job

logger = logging.getLogger("django_cogworker")


class _Opened(threading.local):
    """``opened`` is set in a thread once it has opened a database
    connection (``connection_created``, connected to
    :func:`opened_connection` by the app's ``ready()``). False by default
    through the class: read twice per job, a missing attribute read with
    ``getattr``'s default would raise and catch an AttributeError each time."""

    opened = False


_thread = _Opened()

#: What :func:`begin` hands the runner: the payload, its job, the job's
#: context, and whether it has a ``timeout`` or ``hard_timeout``.
Begun = tuple[Payload, "Job", JobContext, bool]


def opened_connection(sender: Any, **kwargs: Any) -> None:
    _thread.opened = True


def opened_here() -> bool:
    """Whether this thread has opened a database connection."""
    return _thread.opened


def close_old_connections_here() -> None:
    """``close_old_connections``, in a thread that opened a connection."""
    if _thread.opened:
        close_old_connections()


def begin(raw: bytes, payload: Payload | None, queue: str) -> Begun | Outcome:
    """The job a payload names and its context (``current_job()``); or,
    for a payload that cannot run, its outcome: filed in dead (G13)."""
    if payload is None:
        try:
            payload = decode(raw)
        except BadPayload as exc:
            return dead_letter(raw, exc, time.time())
    job = registry.get(payload["job"])
    if job is None:
        error = JobNotRegistered(registry.not_registered_message(payload["job"]))
        return dead_letter(raw, error, time.time())
    ctx = JobContext(
        jid=str(payload.get("jid") or ""),
        queue=str(payload.get("queue") or queue),
        retry_count=retry.next_retry_count(payload),
        name=job.name,
    )
    # Written into the payload at enqueue, from @job or .set(); a plain job
    # pays these two tests and nothing else.
    limited = "timeout" in payload or "hard_timeout" in payload
    if limited:
        timeout_s = payload.get("timeout")
        if timeout_s is not None:
            deadline = time.monotonic() + timeout_s
            ctx = TimedJobContext(ctx.jid, ctx.queue, ctx.retry_count, ctx.name, deadline)
    # The one test a plain job pays for workflows (SPEC section 13): every
    # payload of one carries "bid" (None for a chain's step outside any batch).
    if "bid" in payload:
        object.__setattr__(ctx, "workflow", payload)  # frozen: set once, here
    return payload, job, ctx, limited


def failed(
    payload: Payload, exc: BaseException, config: Config, job: Job, took_s: float, run: middleware.ServerRun
) -> Outcome:
    """A run that raised: its outcome, told to the server middleware. Any
    ``BaseException`` the job raised (SystemExit, KeyboardInterrupt and the
    like) is its failure (G14): let through, it would leave the job on the
    in-progress list, requeued as a stray and run again forever. But for
    ``OverLimit``: its code met a full limiter, and it waits (SPEC 14)."""
    if isinstance(exc, OverLimit):
        run.after(WAITING)
        return Outcome(WAIT, jid=str(payload.get("jid") or ""), failed=None, waits_for=exc.limiter)
    outcome, result = failure_of(payload, exc, config, job, took_s)
    run.after(result)
    return outcome


def failure_of(
    payload: Payload, exc: BaseException, config: Config, job: Job, took_s: float
) -> tuple[Outcome, middleware.Result]:
    """A failed run's outcome, and what the server middleware is told of it."""
    outcome = failure(payload, exc, config, job, took_s)
    return outcome, result_of(outcome, exc)


def succeeded(jid: str, job: Job, took_s: float, run: middleware.ServerRun) -> Outcome:
    outcome = success(jid, job, took_s)
    run.after(SUCCESS)
    return outcome


def flow_succeeded(
    payload: Payload, value: Any, config: Config, job: Job, took_s: float, run: middleware.ServerRun
) -> Outcome:
    """A workflow's job that returned (SPEC section 13): a chord member's
    or chain step's value must be JSON within BATCH_RESULT_MAX_BYTES, else
    the run failed, with an error that says so."""
    outcome, result = handed_on(
        success(str(payload.get("jid") or ""), job, took_s), payload, value, config, job
    )
    run.after(result)
    return outcome


def handed_on(
    outcome: Outcome, payload: Payload, value: Any, config: Config, job: Job
) -> tuple[Outcome, middleware.Result]:
    """A workflow job's success with its value handed on, or the failure
    its value makes (not JSON, too large)."""
    try:
        outcome.result = effects.result_of(payload, value, config)
    except effects.ResultRefused as exc:
        took_s = outcome.ran[1] if outcome.ran else 0.0
        return failure_of(payload, exc, config, job, took_s)
    return outcome, SUCCESS


def success(jid: str, job: Job, took_s: float) -> Outcome:
    """A run that returned: its outcome (the middleware is told ``SUCCESS``)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("jid=%s %s done in %.3fs", jid, job.name, took_s)
    return Outcome(ACK, jid=jid, ran=(job.name, took_s))
