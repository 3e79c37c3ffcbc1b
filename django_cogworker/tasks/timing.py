"""A task's time options: ``expires``, ``timeout`` and ``hard_timeout``.

The meaning and the rules of ``@job``'s (SPEC section 14): ``.using()`` and,
where the framework passes extra options to the task class (Django >= 6.1,
the backport), ``@task(...)`` set them on ``CogworkerTask``;
:func:`time_limits` under ``@task`` works on every version. The backend
writes them into the payload as ``@job`` does, so the worker honours them
as it honours a job's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django_cogworker.job import Job

F = TypeVar("F", bound=Callable[..., Any])

#: Function attribute set by :func:`time_limits`: option -> seconds or None.
TIME_ATTR = "cogworker_time_limits"

#: The time options of ``@job`` that a task takes too.
TIME_OPTIONS = ("expires", "timeout", "hard_timeout")


def time_limits(
    *, expires: float | None = None, timeout: float | None = None, hard_timeout: float | None = None
) -> Callable[[F], F]:
    """Per-task time options, under ``@task`` (on every Django version)::

        @task
        @time_limits(expires=600, timeout=30)
        def refresh_quote(symbol): ...

    ``expires``: seconds after it is due that the task may still start
    (later, it is dropped unrun); ``timeout``: ``JobTimeout`` is raised in
    the task at that many seconds; ``hard_timeout``: a run still going that
    long makes its process drain and exit 3. None: what ``.using()`` or
    ``@task(...)`` say, else none."""
    values = {"expires": expires, "timeout": timeout, "hard_timeout": hard_timeout}
    problem = time_limits_problem(values)
    if problem:
        raise TypeError(f"time_limits: {problem}")

    def apply(func: F) -> F:
        if not inspect.isfunction(func):
            # Above @task it would get the (frozen) Task, not the function.
            raise TypeError(f"time_limits goes below @task, on the function itself, not on {func!r}")
        setattr(func, TIME_ATTR, values)
        return func

    return apply


def _validated_only() -> None:
    """The function of the throwaway jobs :func:`time_limits_problem` makes."""


def time_limits_problem(values: Mapping[str, Any]) -> str:
    """What is wrong with these ``expires``/``timeout``/``hard_timeout``
    (empty: nothing). ``Job`` decides, as for ``@job``: the rules have one
    home; the wording here names the option as a task spells it."""
    for option, value in values.items():
        try:
            Job(func=_validated_only, name="task", **{option: value})
        except TypeError:
            return f"{option} must be a positive number of seconds or None, got {value!r}"
    try:
        Job(func=_validated_only, name="task", **values)
    except TypeError as exc:  # a hard_timeout shorter than the timeout
        return str(exc).removeprefix("job 'task': ")
    return ""


def task_time_limits(task: Any) -> dict[str, Any]:
    """A task's ``expires``, ``timeout`` and ``hard_timeout``: its own
    (``.using()``, ``@task(...)``), else ``@time_limits``'s, else None."""
    below = getattr(task.func, TIME_ATTR, None) or {}
    found = {}
    for option in TIME_OPTIONS:
        value = getattr(task, option, None)
        found[option] = value if value is not None else below.get(option)
    return found
