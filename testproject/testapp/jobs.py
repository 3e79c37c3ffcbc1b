"""Jobs the test suite runs in real worker processes.

Each records what happened in Redis under the test's own namespace, so a
test can see every run, in any process.
"""

from __future__ import annotations

import json
import os
import signal
import time

from django_cogworker import current_job, job
from django_cogworker.conf import get_config
from django_cogworker.connection import get_redis


def _note(kind: str, **extra: object) -> None:
    ctx = current_job()
    entry = {"jid": ctx.jid if ctx else None, "pid": os.getpid(), "at": time.time(), **extra}
    if ctx is not None:
        entry.update(queue=ctx.queue, retry_count=ctx.retry_count, name=ctx.name)
    get_redis().rpush(f"{get_config().namespace}:test:{kind}", json.dumps(entry))


@job
def record(tag: object = None) -> None:
    _note("runs", tag=tag)


@job(queue="mail")
def record_mail(tag: object = None) -> None:
    _note("runs", tag=tag)


@job
def sleep_then_record(seconds: float, tag: object = None) -> None:
    _note("started", tag=tag)
    time.sleep(seconds)
    _note("runs", tag=tag)


@job(retry=2, retry_in=lambda count, exc: 0.1)
def fail(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


@job(retry=0, dead=False)
def fail_and_drop(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


def exhausted(payload: dict, exc: BaseException) -> None:
    get_redis().rpush(f"{get_config().namespace}:test:exhausted", json.dumps(payload))


@job(retry=1, retry_in=lambda count, exc: 0.1, on_exhausted=exhausted)
def fail_with_hook(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise RuntimeError(message)


@job(retry=5)
def kill_own_process() -> None:
    """A poison pill: its process dies under it (as with the OOM killer)."""
    _note("runs", tag="kill")
    os.kill(os.getpid(), signal.SIGKILL)


def error_handler(exc: BaseException, context: dict) -> None:
    get_redis().rpush(
        f"{get_config().namespace}:test:errors",
        json.dumps({"error": type(exc).__name__, "jid": context.get("jid"), "job": context.get("job")}),
    )
