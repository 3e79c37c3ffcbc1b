"""Django Tasks (``@task``) the test suite runs on cogworker workers.

Imported by the worker's autodiscovery when ``TASKS`` selects the cogworker
backend (testproject/settings.py does when a Tasks framework is installed).
Each task and each Tasks signal of these tasks records what happened in
Redis under the test's namespace, so a test sees every run, in any process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from django.dispatch import receiver

from django_cogworker import current_job
from django_cogworker.conf import get_config
from django_cogworker.connection import get_redis
from django_cogworker.tasks import retry_options, time_limits
from django_cogworker.tasks.compat import TaskContext, task_enqueued, task_finished, task_started
from testproject.testapp import jobs

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


def _note(kind: str, **extra: Any) -> None:
    ctx = current_job()
    entry = {"jid": ctx.jid if ctx else None, "pid": os.getpid(), "at": time.time(), **extra}
    if ctx is not None:
        entry.update(queue=ctx.queue, retry_count=ctx.retry_count, name=ctx.name)
    get_redis().rpush(f"{get_config().namespace}:test:{kind}", json.dumps(entry))


def retry_quickly(count: int, exc: BaseException) -> float:
    return 0.1


def retry_in_an_hour(count: int, exc: BaseException) -> float:
    """Keeps a failed attempt in the retry set until a test retries it."""
    return 3600.0


@task
def add(a: int, b: int) -> int:
    _note("runs", tag="add")
    return a + b


@task
def echo(value: Any) -> Any:
    _note("runs", tag="echo")
    return value


@task
def record(tag: str) -> None:
    _note("runs", tag=tag)


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    _note("runs", tag="async_add")
    return a + b


@task
@retry_options(retry=2, retry_in=retry_quickly)
def always_fails(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


@task(takes_context=True)
@retry_options(retry=1, retry_in="testproject.testapp.tasks.retry_in_an_hour")
def fails_first_attempt(context: TaskContext, tag: str) -> dict[str, Any]:
    _note("runs", tag=tag, attempt=context.attempt)
    if context.attempt == 1:
        raise RuntimeError(f"first attempt of {tag}")
    return {"attempt": context.attempt, "tag": tag}


@task(takes_context=True)
def slow_on_first_attempt(context: TaskContext, seconds: float) -> dict[str, Any]:
    """Long enough on its first attempt for a test to kill the worker under it."""
    _note("started", attempt=context.attempt)
    if context.attempt == 1:
        time.sleep(seconds)
    return {"attempt": context.attempt}


@task
@retry_options(retry_in="testproject.testapp.tasks.retry_in_an_hour")
def raises(kind: str) -> None:
    """Raises a BaseException that is not an Exception: ``SystemExit`` or
    ``KeyboardInterrupt``."""
    _note("runs", tag=kind)
    if kind == "SystemExit":
        raise SystemExit(f"{kind} raised by the task")
    raise KeyboardInterrupt(f"{kind} raised by the task")


@task
def returns_an_object() -> object:
    _note("runs", tag="object")
    return object()


@task
@time_limits(expires=1)
def expiring(tag: str) -> None:
    _note("runs", tag=tag)


@task
@retry_options(retry=0)
@time_limits(timeout=1)
def busy_past_timeout(tag: str) -> None:
    """``jobs.busy_past_timeout``'s busy loop inside ``except Exception``
    (called as a plain function), as a task."""
    jobs.busy_past_timeout(tag)


def helper() -> None:
    """A plain function: not a task, so no payload may run it."""
    _note("runs", tag="helper")


def _record_signal(name: str, task_result: Any) -> None:
    if task_result.task.module_path.startswith(__name__ + "."):
        _note(
            "signals",
            signal=name,
            id=task_result.id,
            status=str(task_result.status),
            task=task_result.task.module_path,
            attempts=task_result.attempts,
        )


@receiver(task_enqueued)
def on_enqueued(sender: type, task_result: Any, **kwargs: Any) -> None:
    _record_signal("task_enqueued", task_result)


@receiver(task_started)
def on_started(sender: type, task_result: Any, **kwargs: Any) -> None:
    _record_signal("task_started", task_result)


@receiver(task_finished)
def on_finished(sender: type, task_result: Any, **kwargs: Any) -> None:
    _record_signal("task_finished", task_result)
