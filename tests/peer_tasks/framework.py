"""The names the vendored suites import, from the Tasks framework the
backend implements: ``django.tasks`` on Django >= 6.0, the ``django-tasks``
backport (``django_tasks``) on 5.2. The suites' own ``from django.tasks
import ...`` lines import from here instead, so the same files run on both.
"""

from __future__ import annotations

import pytest

from django_cogworker.tasks.compat import FRAMEWORK

if FRAMEWORK == "django.tasks":
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
else:
    from django_tasks import (  # type: ignore[no-redef]
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.immediate import ImmediateBackend  # type: ignore[no-redef]
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )

#: The logger the framework's signal receivers write to.
LOGGER = "django.tasks" if FRAMEWORK == "django.tasks" else "django_tasks"
BACKPORT = FRAMEWORK != "django.tasks"


def framework_61(feature: str) -> pytest.MarkDecorator:
    """Marks a test of the framework itself (no backend is involved) that
    the backport does not pass: ``feature`` is what Django 6.1 added."""
    return pytest.mark.xfail(
        BACKPORT, reason=f"django-tasks backport lacks Django 6.1's {feature}", strict=True
    )


__all__ = [
    "BACKPORT",
    "DEFAULT_TASK_QUEUE_NAME",
    "LOGGER",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "ImmediateBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "framework_61",
    "task",
    "task_backends",
]
