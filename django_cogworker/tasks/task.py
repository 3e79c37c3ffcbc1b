"""``CogworkerTask``: a ``Task`` with cogworker's options per task.

``retry`` and ``retry_in`` (see ``options.py``), and ``expires``,
``timeout`` and ``hard_timeout`` (see ``timing.py``), set per call by
``.using(...)``; on Django >= 6.1 and the backport by ``@task(...)`` too
(the decorator hands its extra keyword arguments to the backend's
``task_class``). The backend validates them, as Django validates every
``Task`` as it is made, and writes them into the payload.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django_cogworker.job import RetryIn
from django_cogworker.tasks.compat import Task


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CogworkerTask(Task):
    """A ``Task`` with cogworker's retry and time options, so that
    ``.using(retry=0, timeout=30)`` sets them per call; ``@retry_options``
    and ``@time_limits`` under ``@task`` set them on every version."""

    #: Retries after the first run: True (``COGWORKER['DEFAULT_RETRY']``), False
    #: or 0 (none), N; None takes the backend's ``OPTIONS['RETRY']``.
    retry: bool | int | None = None
    #: ``(count, exc) -> seconds`` (or None for the default backoff), or its
    #: dotted path; None takes the backend's ``OPTIONS['RETRY_IN']``.
    retry_in: RetryIn | str | None = None
    #: Seconds after it is due (``run_after``, or its enqueue) that the task
    #: may still start; later, it is dropped unrun. None: ``@time_limits``'s, else never.
    expires: float | None = None
    #: Seconds of a run before ``JobTimeout`` is raised in the task. None:
    #: ``@time_limits``'s, else none.
    timeout: float | None = None
    #: Seconds of a run before its process drains and exits 3. None:
    #: ``@time_limits``'s, else none.
    hard_timeout: float | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        retry: bool | int | None = None,
        expires: float | None = None,
        timeout: float | None = None,
        hard_timeout: float | None = None,
    ) -> CogworkerTask:
        """A copy with per-call options, cogworker's included."""
        changes: dict[str, Any] = {}
        for name, value in (
            ("priority", priority),
            ("queue_name", queue_name),
            ("run_after", run_after),
            ("backend", backend),
            ("retry", retry),
            ("expires", expires),
            ("timeout", timeout),
            ("hard_timeout", hard_timeout),
        ):
            if value is not None:
                changes[name] = value
        return dataclasses.replace(self, **changes)
