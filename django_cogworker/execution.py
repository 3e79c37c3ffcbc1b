"""Running one payload to an outcome.

Shared by the worker's processors and by ``testing.drain()``; an ``async
def`` job given here runs on an event loop of its own (``arun.run_here``;
a worker hands those to its loop before, ``coroutines.py``). The caller
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

The steps an ``async def`` job shares with a plain one (``runs.begin``,
``failed``, ``succeeded``) live in ``runs.py``; what a failure becomes is
decided in ``outcomes.py``.
"""

from __future__ import annotations

import threading
import time

from django_cogworker import middleware, timeouts
from django_cogworker.conf import Config
from django_cogworker.context import TimedJobContext, reset_current, set_current
from django_cogworker.outcomes import (
    ACK,
    DEAD,
    RETRY,
    WAIT,
    Outcome,
    dead_letter,
    failure,
    hard_timed_out,
    limit_failed,
)
from django_cogworker.payload import Payload
from django_cogworker.runs import begin, close_old_connections_here, failed, flow_succeeded, succeeded

__all__ = [
    "ACK",
    "DEAD",
    "RETRY",
    "WAIT",
    "Outcome",
    "dead_letter",
    "execute",
    "failure",
    "hard_timed_out",
    "limit_failed",
]


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
    begun = begin(raw, payload, queue)
    if isinstance(begun, Outcome):
        return begun
    payload, job, ctx, limited = begun
    if job.coroutine:
        # An ``async def`` job outside a worker's event loop (the testing
        # helpers, a direct call): on a loop of its own.
        from django_cogworker.arun import run_here  # asyncio's side: only for such a job

        return run_here(raw, config, queue, payload)
    jid = ctx.jid
    token = set_current(ctx)
    try:
        # Inside the try: if it raises, the context is still reset below.
        if close_connections:
            close_old_connections_here()
        # The server middleware (unique and periodic locks first) wraps the
        # call, and learns how the run ended before the outcome is written:
        # locks are released on success and terminal failure, kept on retry.
        run = middleware.server_chain().start(payload)
        began = time.monotonic()
        try:
            run.before()
            if not limited:
                value = job.func(*payload.get("args", []), **payload.get("kwargs", {}))
            else:
                # Armed around the function alone: a JobTimeout never lands
                # in the middleware or in what follows.
                value = timeouts.call(
                    jid,
                    payload.get("timeout"),
                    ctx.deadline if isinstance(ctx, TimedJobContext) else None,
                    payload.get("hard_timeout"),
                    job.func,
                    payload.get("args", []),
                    payload.get("kwargs", {}),
                )
        except BaseException as exc:
            outcome = failed(payload, exc, config, job, time.monotonic() - began, run)
            if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
                # A Ctrl-C in the main thread (the testing helpers run jobs
                # there) still stops the caller, once it has filed the job:
                # raised here, the job would be in no queue and no set.
                outcome.interrupted = exc
        else:
            if ctx.workflow is None:
                outcome = succeeded(jid, job, time.monotonic() - began, run)
            else:
                outcome = flow_succeeded(payload, value, config, job, time.monotonic() - began, run)
        if ctx.workflow is not None:
            outcome.workflow = ctx.workflow
    finally:
        reset_current(token)
        if close_connections:
            close_old_connections_here()
    return outcome
