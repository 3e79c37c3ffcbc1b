"""Tasks as cogworker jobs: registration, and what a worker runs.

Duties: register every task the backend validates as a ``Job`` named
``tasks:<module path>`` (so the worker knows exactly the tasks its modules
defined, and nothing is imported from a payload); run one attempt of a task
inside the worker, recording it in the result record (``RUNNING``, then
``SUCCESSFUL`` with the return value, or ``READY`` with the error of any
``BaseException`` before re-raising it so that cogworker files it); mark
it ``FAILED`` when its retries are exhausted; send ``task_started`` and
``task_finished``.

The backend imports this module, never the other way: what a run needs of
the backend its result belongs to (its ``OPTIONS``, the sender of its
signals) comes through the :data:`FindOwner` the backend hands over with
each task it registers.

The job itself is an ordinary cogworker job: ``execution.execute`` runs it,
the retry and dead machinery files it. An ``async def`` task's job is an
``async def`` job (:func:`arun`), awaited on the worker's event loop. A record write that fails after the
task ran is logged, never raised: raising would retry, and so re-run, a task
that has already done its work; nor does a ``timeout`` that runs out as
the task returns (:func:`_shielded`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import redis
from asgiref.sync import sync_to_async

from django_cogworker import registry
from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.context import current_job
from django_cogworker.errors import JobTimeout
from django_cogworker.job import Job
from django_cogworker.payload import Payload
from django_cogworker.tasks.compat import (
    Task,
    TaskContext,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from django_cogworker.tasks.names import job_name
from django_cogworker.tasks.options import TaskOptions, resolve_retry_in, task_retry, task_retry_in
from django_cogworker.tasks.records import (
    Record,
    check_json,
    dumps,
    error_entry,
    loads,
    new_record,
    pending_ttl_s,
    to_result,
)

if TYPE_CHECKING:
    from django.dispatch import Signal

logger = logging.getLogger("django_cogworker")

_tasks: dict[str, Task] = {}
_lock = threading.Lock()


class Owner(NamedTuple):
    """What a run needs of the backend its result belongs to."""

    options: TaskOptions
    #: The sender of ``task_started`` and ``task_finished``.
    sender: type


#: ``(the record's backend alias, the task) -> Owner``: the first of the two
#: aliases that names a cogworker backend in this process's ``TASKS``.
FindOwner = Callable[[str | None, Task | None], Owner]


def register(task: Task, find_owner: FindOwner) -> None:
    """Makes ``task`` runnable by this process's workers (idempotent: the
    copies ``.using()`` makes share their function and are skipped)."""
    name = job_name(task.module_path)
    existing = _tasks.get(name)
    if existing is not None and existing.func is task.func and registry.get(name) is not None:
        return
    with _lock:
        _tasks[name] = task
        retry = task_retry(task)
        registry.register(
            Job(
                func=_runner(name, find_owner, inspect.iscoroutinefunction(task.func)),
                name=name,
                queue=task.queue_name or DEFAULT_QUEUE,
                retry=True if retry is None else retry,
                retry_in=_retry_in(name, find_owner),
                on_exhausted=_exhausted(find_owner),
            )
        )


def lookup(module_path: str) -> Task | None:
    return _tasks.get(job_name(module_path))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _runner(name: str, find_owner: FindOwner, coroutine: bool) -> Callable[..., Any]:
    """The job's function: an ``async def`` one for an ``async def`` task,
    which a worker then awaits on its event loop."""

    def run_task(*args: Any, **kwargs: Any) -> None:
        run(name, list(args), kwargs, find_owner)

    async def arun_task(*args: Any, **kwargs: Any) -> None:
        await arun(name, list(args), kwargs, find_owner)

    func = arun_task if coroutine else run_task
    func.__qualname__ = func.__name__ = name
    return func


def _retry_in(name: str, find_owner: FindOwner) -> Callable[[int, BaseException], float | int | None]:
    def retry_in(count: int, exc: BaseException) -> float | int | None:
        task = _tasks.get(name)
        value = task_retry_in(task) if task is not None else None
        if value is None:
            value = find_owner(None, task).options.retry_in
        func = resolve_retry_in(value)
        return func(count, exc) if func is not None else None

    return retry_in


def _exhausted(find_owner: FindOwner) -> Callable[[Payload, BaseException], None]:
    return lambda payload, exc: exhausted(payload, exc, find_owner)


class _Attempt(NamedTuple):
    """One attempt of a task under way: its record and where it lives."""

    task: Task
    client: redis.Redis
    key: str
    jid: str
    record: Record
    owner: Owner
    #: The arguments the task's function is called with (its context first).
    args: list[Any]


def run(name: str, args: list[Any], kwargs: dict[str, Any], find_owner: FindOwner) -> None:
    """One attempt of a task, inside a cogworker job."""
    attempt = _start(name, args, kwargs, find_owner)
    try:
        value = attempt.task.call(*attempt.args, **kwargs)
    except BaseException as exc:
        _shielded(functools.partial(_failed, attempt, exc))
        raise
    _ended(attempt, name, value)


T = TypeVar("T")


def _shielded(step: Callable[[], T]) -> T:
    """A step of the bookkeeping after the task's code, still under its
    ``timeout`` (armed around the whole job): a ``JobTimeout`` in it came
    as the task returned, and comes once, so the step is done again, whole;
    let through, the task's retry would run it twice."""
    try:
        return step()
    except JobTimeout:
        return step()


async def arun(name: str, args: list[Any], kwargs: dict[str, Any], find_owner: FindOwner) -> None:
    """:func:`run` for an ``async def`` task, on the worker's event loop
    (SPEC section 15): the task awaited there, its record writes and signals
    in a thread, so that the loop never waits on them."""
    attempt = await sync_to_async(_start, thread_sensitive=False)(name, args, kwargs, find_owner)
    try:
        value = await attempt.task.func(*attempt.args, **kwargs)
    except BaseException as exc:
        await sync_to_async(_failed, thread_sensitive=False)(attempt, exc)
        raise
    await sync_to_async(_ended, thread_sensitive=False)(attempt, name, value)


def _start(name: str, args: list[Any], kwargs: dict[str, Any], find_owner: FindOwner) -> _Attempt:
    """The record says RUNNING, and ``task_started`` is sent."""
    ctx = current_job()
    if ctx is None:
        raise RuntimeError(f"{name} runs only inside a cogworker job; call the task function to run it here")
    task = _tasks[name]
    client, key = get_redis(), get_keys().for_queue(ctx.queue).result(ctx.jid)
    now = time.time()
    record = _record_for_run(client, key, ctx.jid, ctx.queue, task, args, kwargs, now)
    owner = find_owner(record.get("backend"), task)
    options = owner.options
    record.update(
        status=TaskResultStatus.RUNNING.value,
        started_at=record.get("started_at") or now,
        last_attempted_at=now,
    )
    record["worker_ids"] = [*record.get("worker_ids", []), worker_id()]
    # Raised if it fails: the task has not run yet, so a retry is safe.
    client.set(key, dumps(record), px=_ms(pending_ttl_s(record, options.result_ttl_s, now)))
    result = to_result(record, task)
    _send(task_started, owner.sender, result)
    call_args = [TaskContext(task_result=result), *args] if task.takes_context else args
    return _Attempt(task, client, key, ctx.jid, record, owner, call_args)


def _failed(attempt: _Attempt, exc: BaseException) -> None:
    # Any BaseException, as Django's backends record SystemExit: the job
    # fails (filed by execute() like a plain job's), so the record must
    # say so, never stay RUNNING while the job waits in retry or dead. A
    # copy of the running record, so that done again it writes the same.
    record = dict(attempt.record)
    record["errors"] = [*record.get("errors", []), error_entry(exc)]
    record["status"] = TaskResultStatus.READY.value
    ttl_s = pending_ttl_s(record, attempt.owner.options.result_ttl_s, time.time())
    _save_quietly(attempt.client, attempt.key, record, ttl_s)


def _ended(attempt: _Attempt, name: str, value: Any) -> None:
    done = _shielded(lambda: _succeeded(attempt, name, value))
    with contextlib.suppress(JobTimeout):  # see _shielded: the run succeeded all the same
        _send(task_finished, attempt.owner.sender, to_result(done, attempt.task))


def _succeeded(attempt: _Attempt, name: str, value: Any) -> Record:
    """Records a run that returned ``value``; the running record is left as
    it was, so that done again the step writes the same record."""
    record = dict(attempt.record, finished_at=time.time())
    try:
        value = normalize_json(value)
        check_json(value)
    except (TypeError, ValueError) as exc:
        # The task did its work; running it again would not change what it
        # returns. Failed, without a retry.
        logger.warning(
            "jid=%s %s failed (%s: %s): its return value is not JSON; result FAILED, no retry",
            attempt.jid,
            name,
            type(exc).__name__,
            exc,
        )
        record["errors"] = [*record.get("errors", []), error_entry(exc)]
        record["status"] = TaskResultStatus.FAILED.value
    else:
        record["status"] = TaskResultStatus.SUCCESSFUL.value
        record["return_value"] = value
    _save_quietly(attempt.client, attempt.key, record, attempt.owner.options.result_ttl_s)
    return record


def exhausted(payload: Payload, exc: BaseException, find_owner: FindOwner) -> None:
    """``on_exhausted`` of every task job: the result becomes ``FAILED``."""
    jid = str(payload.get("jid") or "")
    task = _tasks.get(str(payload.get("job")))
    client, k = get_redis(), get_keys().for_payload(payload)
    raw = client.get(k.result(jid))
    try:
        record = loads(raw) if raw is not None else None
    except ValueError:
        record = None
    if record is None:
        logger.warning("jid=%s %s exhausted its retries; its result record is gone", jid, payload.get("job"))
        return
    owner = find_owner(record.get("backend"), task)
    record["status"] = TaskResultStatus.FAILED.value
    record["finished_at"] = time.time()
    _save_quietly(client, k.result(jid), record, owner.options.result_ttl_s)
    if task is not None:
        _send(task_finished, owner.sender, to_result(record, task))


def _record_for_run(
    client: redis.Redis,
    key: str,
    jid: str,
    queue: str,
    task: Task,
    args: list[Any],
    kwargs: dict[str, Any],
    now: float,
) -> Record:
    raw = client.get(key)
    if raw is not None:
        try:
            return loads(raw)
        except ValueError as exc:
            logger.warning(
                "jid=%s %s has an unreadable result record (%s); rebuilt",
                jid,
                job_name(task.module_path),
                exc,
            )
    else:
        # Expired while the task waited (a retry days later), or the job was
        # pushed by something other than enqueue(): start a new record.
        logger.warning("jid=%s %s has no result record; rebuilt", jid, job_name(task.module_path))
    record = new_record(
        result_id=jid,
        module_path=task.module_path,
        alias=task.backend,
        queue_name=task.queue_name,
        priority=task.priority,
        run_after_s=None,
        args=args,
        kwargs=kwargs,
        queue=queue,
        now=now,
    )
    record["enqueued_at"] = None
    return record


def _save_quietly(client: redis.Redis, key: str, record: Record, ttl_s: float) -> None:
    try:
        client.set(key, dumps(record), px=_ms(ttl_s))
    except redis.RedisError as exc:
        name = job_name(str(record.get("task")))
        logger.error("jid=%s %s could not store its result record: %s", record.get("id"), name, exc)


def _send(signal: Signal, sender: type, result: Any) -> None:
    # send_robust: a failing receiver is logged by Django and must not turn a
    # finished task into a retried one.
    signal.send_robust(sender=sender, task_result=result)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
