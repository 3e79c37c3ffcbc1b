"""``current_job()``: the context of the job running in this thread."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True)
class JobContext:
    jid: str
    queue: str
    retry_count: int
    name: str


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("cogworker_job", default=None)


def current_job() -> JobContext | None:
    """The running job's ``jid``, ``queue``, ``retry_count`` and ``name``;
    None outside a job."""
    return _current.get()


def set_current(ctx: JobContext | None) -> contextvars.Token[JobContext | None]:
    return _current.set(ctx)


def reset_current(token: contextvars.Token[JobContext | None]) -> None:
    _current.reset(token)
