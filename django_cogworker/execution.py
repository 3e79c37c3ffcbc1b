"""Running one payload to an outcome.

Shared by the worker's processors and by ``testing.drain()``: the caller
applies the :class:`Outcome` (ack, or file in retry/dead). The job runs
inside the server middleware chain, whose built-in members take, extend and
release unique and periodic locks: the only Redis calls made here, and only
for jobs that hold such a lock. Keeps G13 (bad payloads filed in dead with
their raw text) and G14 (``close_old_connections`` around every job; a job's
exception never escapes). In a thread that never opened a database
connection, ``close_old_connections`` has nothing to close, and is not
called: it costs a look into each alias's thread-local, a tenth of a no-op
job's time. A job with a ``timeout`` or ``hard_timeout`` runs its function
through ``timeouts.call``; a plain one pays one test for it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections
from django.utils.module_loading import import_string

from django_cogworker import expiry, middleware, registry, retry, timeouts
from django_cogworker.conf import Config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.context import JobContext, TimedJobContext, reset_current, set_current
from django_cogworker.errors import BadPayload, JobNotRegistered, JobTimeout, OverLimit
from django_cogworker.payload import Payload, decode, encode_stored, salvage

if TYPE_CHECKING:
    from django_cogworker.job import Job

logger = logging.getLogger("django_cogworker")

#: ``opened`` is set in a thread once it has opened a database connection
#: (``connection_created``, connected to :func:`opened_connection` by the
#: app's ``ready()``).
_thread = threading.local()

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

    def encoded(self) -> bytes:
        assert self.payload is not None
        return encode_stored(self.payload)


def opened_connection(sender: Any, **kwargs: Any) -> None:
    _thread.opened = True


def _close_old_connections() -> None:
    if getattr(_thread, "opened", False):
        close_old_connections()


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


def execute(
    raw: bytes,
    config: Config,
    *,
    queue: str = "",
    close_connections: bool = True,
    payload: Payload | None = None,
) -> Outcome:
    """Runs the job a payload names and says what should happen to it.

    ``payload`` is ``raw`` decoded already (a worker parses it once, at
    fetch). ``close_connections=False`` is for the testing helpers, which
    run jobs in the test's own thread: closing its connection there would
    break the test's transaction (Django's test client skips it for the same
    reason)."""
    if payload is None:
        try:
            payload = decode(raw)
        except BadPayload as exc:
            return dead_letter(raw, exc, time.time())
    job = registry.get(payload["job"])
    if job is None:
        error = JobNotRegistered(registry.not_registered_message(payload["job"]))
        return dead_letter(raw, error, time.time())

    jid = str(payload.get("jid") or "")
    ctx = JobContext(
        jid=jid,
        queue=str(payload.get("queue") or queue),
        retry_count=retry.next_retry_count(payload),
        name=job.name,
    )
    # Written into the payload at enqueue, from @job or .set(); a plain job
    # pays these two tests and nothing else.
    limited = "timeout" in payload or "hard_timeout" in payload
    if limited:
        timeout_s, hard_timeout_s = payload.get("timeout"), payload.get("hard_timeout")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if deadline is not None:
            ctx = TimedJobContext(ctx.jid, ctx.queue, ctx.retry_count, ctx.name, deadline)
    token = set_current(ctx)
    try:
        # Inside the try: if it raises, the context is still reset below.
        if close_connections:
            _close_old_connections()
        # The server middleware (unique and periodic locks first) wraps the
        # call, and learns how the run ended before the outcome is written:
        # locks are released on success and terminal failure, kept on retry.
        run = middleware.server_chain().start(payload)
        began = time.monotonic()
        try:
            run.before()
            if not limited:
                job.func(*payload.get("args", []), **payload.get("kwargs", {}))
            else:
                # Armed around the function alone: a JobTimeout never lands
                # in the middleware or in what follows.
                timeouts.call(
                    jid,
                    timeout_s,
                    deadline,
                    hard_timeout_s,
                    job.func,
                    payload.get("args", []),
                    payload.get("kwargs", {}),
                )
        except OverLimit as exc:
            outcome = Outcome(WAIT, jid=jid, failed=None, waits_for=exc.limiter)
            run.after(_WAITING)
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt and the like, raised by the job
            # itself, are its failure too (G14): let through, they would
            # leave it on the in-progress list, requeued as a stray and run
            # again forever.
            took_s = time.monotonic() - began
            outcome = failure(payload, exc, config, job, took_s)
            run.after(_result(outcome, exc))
            if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
                # A Ctrl-C in the main thread (the testing helpers run jobs
                # there) still stops the caller, once it has filed the job:
                # raised here, the job would be in no queue and no set.
                outcome.interrupted = exc
        else:
            took_s = time.monotonic() - began
            if logger.isEnabledFor(logging.INFO):
                logger.info("jid=%s %s done in %.3fs", jid, job.name, took_s)
            outcome = Outcome(ACK, jid=jid, ran=(job.name, took_s))
            run.after(_SUCCESS)
    finally:
        reset_current(token)
        if close_connections:
            _close_old_connections()
    return outcome


_SUCCESS = middleware.Result(middleware.SUCCESS)
_WAITING = middleware.Result(middleware.WAITING)


def _result(outcome: Outcome, exc: BaseException) -> middleware.Result:
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
            return Outcome(ACK, failed=True, jid=jid, ran=ran)  # the middleware releases its lock (final)
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
