"""Which Tasks framework: ``django.tasks`` (Django >= 6.0) or the backport.

The backport (``django-tasks``, import name ``django_tasks``) is used only
when Django has no ``django.tasks``; on Django 6 it is ignored even if
installed, so that ``@task`` from ``django.tasks`` and this backend agree on
one ``Task`` class. Importing this module without either raises ImportError
with what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        from django.tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        try:
            from django.utils.json import normalize_json
        except ImportError:  # pragma: no cover - a Django 6 without it
            normalize_json = None

        FRAMEWORK = "django.tasks"
    except ImportError:
        try:
            from django_tasks import (
                DEFAULT_TASK_QUEUE_NAME,
                TaskContext,
                TaskResult,
                TaskResultStatus,
                task_backends,
            )
        except ImportError:
            raise ImportError(
                "django_cogworker.tasks needs Django's Tasks framework: Django >= 6.0, or on Django 5.2 "
                "the backport (pip install 'django-cogworker[tasks]', i.e. django-tasks)"
            ) from None
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            DEFAULT_TASK_PRIORITY,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskError,
        )
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        FRAMEWORK = "django_tasks"

    if normalize_json is None:  # pragma: no cover

        def normalize_json(obj):
            """Django's: JSON-compatible types, recursively (tuples become lists)."""
            from collections.abc import Mapping, Sequence

            if isinstance(obj, Mapping):
                return {normalize_json(k): normalize_json(v) for k, v in obj.items()}
            if isinstance(obj, bytes):
                return obj.decode("utf-8")
            if obj is None or isinstance(obj, str | int | float | bool):
                return obj
            if isinstance(obj, Sequence):
                return [normalize_json(v) for v in obj]
            raise TypeError(f"Unsupported type: {type(obj)}")


__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
