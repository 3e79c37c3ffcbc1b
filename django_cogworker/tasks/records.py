"""The result record: what ``get_result()`` returns, kept in Redis.

One JSON object per task run under ``Keys.result(id)`` (the id is the job's
jid), written by ``enqueue()`` in the same MULTI as the push, then by the
worker at the start and the end of every attempt. Times are epoch seconds.
While a task is unfinished its record is kept ``PENDING_RESULT_TTL_S``
(plus the wait for ``run_after``); once finished, ``RESULT_TTL``. Only the
worker running a task writes its record (G2: no second run while its owner
lives), so a plain GET and SET need no lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import traceback
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from django_cogworker.errors import BadPayload
from django_cogworker.escaping import utf8
from django_cogworker.payload import parse
from django_cogworker.retry import BACKTRACE_MAX_CHARS
from django_cogworker.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus
from django_cogworker.tasks.options import PENDING_RESULT_TTL_S

logger = logging.getLogger("django_cogworker")

Record = dict[str, Any]

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(TaskResult) if f.init)


def new_record(
    *,
    result_id: str,
    module_path: str,
    alias: str,
    queue_name: str,
    priority: int,
    run_after_s: float | None,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str,
    now: float,
) -> Record:
    return {
        "id": result_id,
        "task": module_path,
        "backend": alias,
        "queue_name": queue_name,
        "priority": priority,
        "run_after": run_after_s,
        "queue": queue,
        "status": TaskResultStatus.READY.value,
        "enqueued_at": now,
        "started_at": None,
        "finished_at": None,
        "last_attempted_at": None,
        "args": args,
        "kwargs": kwargs,
        "errors": [],
        "worker_ids": [],
    }


def dumps(record: Record) -> bytes:
    return utf8(_encoder.encode(record))


def loads(raw: bytes | str) -> Record:
    """The record, or ValueError saying why it cannot be one (RecursionError
    included: a record nested thousands deep is unreadable, not a crash)."""
    try:
        value = parse(raw)
    except BadPayload as exc:
        raise ValueError(f"result record is {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("task"), str):
        raise ValueError("not a task result record")
    return value


def check_json(value: Any) -> None:
    """Raises TypeError or ValueError if JSON cannot carry ``value`` (nested
    too deeply included)."""
    try:
        _encoder.encode(value)
    except RecursionError:
        raise ValueError("nested too deeply for JSON") from None


def pending_ttl_s(record: Record, result_ttl_s: float, now: float) -> float:
    wait_s = max(0.0, float(record.get("run_after") or 0.0) - now)
    return max(result_ttl_s, PENDING_RESULT_TTL_S) + wait_s


def error_entry(exc: BaseException) -> dict[str, str]:
    cls = type(exc)
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": tb[-BACKTRACE_MAX_CHARS:],
    }


def epoch_s(when: datetime) -> float:
    """Epoch seconds of a datetime; a naive one is in the current time zone
    (Django's meaning of a naive datetime when ``USE_TZ`` is off)."""
    if timezone.is_naive(when):
        when = timezone.make_aware(when)
    return when.timestamp()


def to_datetime(epoch: float | None) -> datetime | None:
    if epoch is None:
        return None
    when = datetime.fromtimestamp(float(epoch), tz=UTC)
    return when if settings.USE_TZ else timezone.make_naive(when)


def as_task(record: Record, task: Task) -> Task:
    """The registered task with the options this run was enqueued with."""
    changes: dict[str, Any] = {}
    for name in ("priority", "queue_name", "backend"):
        if record.get(name) is not None and record[name] != getattr(task, name):
            changes[name] = record[name]
    run_after = to_datetime(record.get("run_after"))
    if run_after != task.run_after:
        changes["run_after"] = run_after
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except Exception as exc:
        # A queue or backend alias that this process's TASKS no longer has:
        # the result is still worth showing, with the task as registered.
        logger.debug("result %s: showing task %s as registered (%s)", record.get("id"), task.module_path, exc)
        return task


def to_result(record: Record, task: Task) -> TaskResult:
    values: dict[str, Any] = {
        "task": as_task(record, task),
        "id": record["id"],
        "status": TaskResultStatus(record["status"]),
        "enqueued_at": to_datetime(record.get("enqueued_at")),
        "started_at": to_datetime(record.get("started_at")),
        "finished_at": to_datetime(record.get("finished_at")),
        "last_attempted_at": to_datetime(record.get("last_attempted_at")),
        "args": list(record.get("args", [])),
        "kwargs": dict(record.get("kwargs", {})),
        "backend": record.get("backend") or task.backend,
        "errors": [
            TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
            for e in record.get("errors", [])
        ],
        "worker_ids": list(record.get("worker_ids", [])),
    }
    result: TaskResult = TaskResult(**{k: v for k, v in values.items() if k in _RESULT_FIELDS})
    if "return_value" in record:
        object.__setattr__(result, "_return_value", record["return_value"])
    return result
