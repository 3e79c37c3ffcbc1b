"""Django's Tasks framework on cogworker: ``TASKS = {"default": {"BACKEND":
"django_cogworker.tasks.CogworkerBackend", ...}}``.

``django.tasks`` on Django >= 6.0, the ``django-tasks`` backport (import name
``django_tasks``) on Django 5.2. A ``@task`` runs as an ordinary cogworker
job named ``tasks:<module path>``, with every guarantee of the worker
(reliable fetch, retries, the dead set, the admin pages); its ``TaskResult``
lives in Redis.

This module imports no part of the framework, so that importing it (the
worker autodiscovers every installed app's ``tasks`` module, this package's
included) works on a Django without one. The backend is loaded on first use.

Importing it adds this package's hooks to the core's registry (the core
never imports it): apps' ``tasks`` modules are autodiscovered when
:func:`backend_configured`, and a payload naming an unknown task is filed
in dead with :func:`not_registered_message`. The registry imports the
module of every ``TASKS`` backend at startup, so the hooks are in place in
every process that uses this backend (a worker's included) before its
apps' modules are imported.

Modules: ``compat`` (which framework), ``options`` (``OPTIONS`` and their
checks, ``@retry_options``), ``timing`` (``expires``, ``timeout`` and
``hard_timeout`` of a task, ``@time_limits``), ``records`` (the result
record in Redis), ``task`` (``CogworkerTask``), ``backend`` (the
backend), ``runner`` (registration, and what a worker runs), ``names`` (a
task's job name, and the error of one no worker knows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_cogworker import registry
from django_cogworker.tasks.names import TASK_JOB_PREFIX, explain_unknown, not_registered_message
from django_cogworker.tasks.options import retry_options
from django_cogworker.tasks.timing import time_limits

if TYPE_CHECKING:
    from django_cogworker.tasks.backend import CogworkerBackend, CogworkerTask

__all__ = [
    "TASK_JOB_PREFIX",
    "CogworkerBackend",
    "CogworkerTask",
    "backend_configured",
    "not_registered_message",
    "retry_options",
    "time_limits",
]

BACKEND_PATHS = ("django_cogworker.tasks.CogworkerBackend", "django_cogworker.tasks.backend.CogworkerBackend")


def __getattr__(name: str) -> Any:
    if name in ("CogworkerBackend", "CogworkerTask"):
        from django_cogworker.tasks import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_configured() -> bool:
    """Whether a ``TASKS`` alias selects this backend (or a subclass of it).

    The worker imports apps' ``tasks`` modules only then: in a project that
    does not use it, ``tasks.py`` may well be another library's (Celery's)."""
    for path in registry.task_backend_paths():
        if path in BACKEND_PATHS:
            return True
        try:
            from django.utils.module_loading import import_string

            from django_cogworker.tasks.backend import CogworkerBackend

            if issubclass(import_string(path), CogworkerBackend):
                return True
        except Exception:
            # No framework installed, or another backend that fails to
            # import: Django's own checks report the latter.
            continue
    return False


registry.add_autodiscover_module("tasks", when=backend_configured)
registry.add_unknown_name_explainer(explain_unknown)
