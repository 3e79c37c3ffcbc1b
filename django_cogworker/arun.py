"""Running one ``async def`` job to an outcome (SPEC section 15).

Duties: the twin of ``execution.execute`` for a coroutine, sharing its
steps (``runs.begin``, ``failed``, ``succeeded``), so a coroutine's
outcome is decided exactly as a thread job's is (retries, dead, error
handlers, middleware, unique locks, ``expires``): what a failure becomes
lives in ``outcomes.py`` alone. Each run gets, in its own task's context:

- ``current_job()`` (a context variable: right in every coroutine at once);
- asgiref's ``ThreadSensitiveContext``, so that the ORM through
  ``sync_to_async`` (``acreate()`` and friends) runs in a thread of this job's
  own instead of queueing behind every other job's on one thread; Django's
  synchronous ORM called on the loop fails the job with
  ``SynchronousOnlyOperation`` (G14: a failure like any other);
- the database connections that thread opened closed at the end (G14): the
  thread ends with the context, and a connection left open there would leak.
  A context starts with a fresh thread, so there is nothing to close at its
  start; a job that made no synchronous call has no thread at all, and pays
  nothing.

``timeout`` is a cancellation at the deadline (delivered at the coroutine's
next ``await``), turned into ``JobTimeout``; ``hard_timeout`` is armed with
the process's one watchdog (``timeouts.hard_limit``), never an exception sent
into the loop's thread. A cancellation that comes from outside the run (the
shutdown, G8) is not an outcome: it propagates, and the caller puts the job
back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import time
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.db import connections

from django_cogworker import middleware, runs, timeouts
from django_cogworker.conf import Config
from django_cogworker.context import JobContext, TimedJobContext, reset_current, set_current
from django_cogworker.errors import JobTimeout
from django_cogworker.outcomes import SUCCESS, Outcome
from django_cogworker.payload import Payload


async def aexecute(raw: bytes, config: Config, *, queue: str = "", payload: Payload | None = None) -> Outcome:
    """``execution.execute`` for a coroutine job, awaited in a task of its own."""
    begun = runs.begin(raw, payload, queue)
    if isinstance(begun, Outcome):
        return begun
    payload, job, ctx, limited = begun
    token = set_current(ctx)
    try:
        async with ThreadSensitiveContext() as own_thread:
            try:
                run = middleware.server_chain().start(payload)
                began = time.monotonic()
                # A run with no middleware to call (middleware.UNTOUCHED)
                # awaits nothing for them.
                try:
                    if run.forms:
                        await run.abefore()
                    value = await _call(job.func, payload, ctx, limited)
                except BaseException as exc:
                    if isinstance(exc, asyncio.CancelledError) and _cancelled_from_outside():
                        raise  # the shutdown's (G8): no outcome, the job goes back
                    outcome, result = runs.failure_of(payload, exc, config, job, time.monotonic() - began)
                    if run.forms:
                        await run.aafter(result)
                else:
                    outcome, after = runs.success(ctx.jid, job, time.monotonic() - began), SUCCESS
                    if ctx.workflow is not None:
                        outcome, after = runs.handed_on(outcome, payload, value, config, job)
                    if run.forms:
                        await run.aafter(after)
                if ctx.workflow is not None:
                    outcome.workflow = ctx.workflow
            finally:
                await _close_connections(own_thread)
    finally:
        reset_current(token)
    return outcome


async def _call(func: Any, payload: Payload, ctx: JobContext, limited: bool) -> Any:
    coro = func(*payload.get("args", []), **payload.get("kwargs", {}))
    if not limited:
        return await coro
    timeout_s, hard_timeout_s = payload.get("timeout"), payload.get("hard_timeout")
    limits = None if hard_timeout_s is None else timeouts.hard_limit(ctx.jid, hard_timeout_s)
    try:
        if not isinstance(ctx, TimedJobContext):
            return await coro
        # The loop's clock is the monotonic one the context's deadline (and
        # so ``remaining()``) counts down on.
        deadline = asyncio.timeout_at(ctx.deadline)
        try:
            async with deadline:
                return await coro
        except TimeoutError:
            if deadline.expired():
                raise JobTimeout(f"job exceeded its timeout of {timeout_s:g}s") from None
            raise  # the job's own TimeoutError (an HTTP client's): a failure as it is
    finally:
        if limits is not None:
            timeouts.disarm(limits)


def _cancelled_from_outside() -> bool:
    """Whether the task running this was cancelled by its owner (the
    shutdown), not by a ``CancelledError`` the job itself raised or let out."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _close_connections(own_thread: ThreadSensitiveContext) -> None:
    """Closes what the job's own thread opened, in that thread (a Django
    connection belongs to the thread that opened it)."""
    executors = getattr(SyncToAsync, "context_to_thread_executor", None)
    if executors is not None and (not executors or own_thread not in executors):
        return  # no synchronous call was made: no thread, no connection
    await sync_to_async(_close_opened)()


def _close_opened() -> None:
    if runs.opened_here():
        connections.close_all()


def run_here(raw: bytes, config: Config, queue: str, payload: Payload) -> Outcome:
    """Runs a coroutine job to its outcome in the calling thread, on an
    event loop of its own: for ``execution.execute`` outside a worker (the
    testing helpers). In a thread that runs a loop already (an async test),
    in a thread of its own, the context copied (``current_job()`` and the
    like)."""
    run = aexecute(raw, config, queue=queue, payload=payload)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cogworker-inline") as pool:
        return pool.submit(context.run, asyncio.run, run).result()
