"""``current_job()``: the context of the job running in this thread."""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class JobContext:
    jid: str
    queue: str
    retry_count: int
    name: str
    #: The payload of a job in a workflow (a batch's member or callback, a
    #: chain's step: SPEC section 13), None for any other. Not a field: set
    #: on the instance for those jobs alone (``runs.begin``), so that a plain
    #: job's context is built as fast as before.
    workflow: ClassVar[dict[str, Any] | None] = None

    def remaining(self) -> float | None:
        """Seconds left before the job's ``timeout``: None, as this job has
        none (:class:`TimedJobContext` is the context of one that has)."""
        return None


@dataclass(frozen=True)
class TimedJobContext(JobContext):
    """The context of a job with a ``timeout`` (a class of its own so that
    a plain job's context is built as fast as before)."""

    #: When the timeout runs out (monotonic clock).
    deadline: float = 0.0

    def remaining(self) -> float | None:
        """Seconds left before the job's ``timeout`` (0.0 once past it), for
        what a ``JobTimeout`` cannot interrupt: give it to a socket, an HTTP
        client, a ``statement_timeout``."""
        return max(0.0, self.deadline - time.monotonic())


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("cogworker_job", default=None)


def current_job() -> JobContext | None:
    """The running job's ``jid``, ``queue``, ``retry_count`` and ``name``,
    and ``remaining()``; None outside a job."""
    return _current.get()


def set_current(ctx: JobContext | None) -> contextvars.Token[JobContext | None]:
    return _current.set(ctx)


def reset_current(token: contextvars.Token[JobContext | None]) -> None:
    _current.reset(token)
