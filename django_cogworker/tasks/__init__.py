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
checks), ``records`` (the result record in Redis), ``backend`` (the backend
and ``CogworkerTask``), ``runner`` (registration, and what a worker runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_cogworker import registry
from django_cogworker.tasks.options import retry_options

if TYPE_CHECKING:
    from django_cogworker.tasks.backend import CogworkerBackend, CogworkerTask

__all__ = [
    "TASK_JOB_PREFIX",
    "CogworkerBackend",
    "CogworkerTask",
    "backend_configured",
    "not_registered_message",
    "retry_options",
]

#: Registry names of tasks: ``tasks:`` + the task's module path. The prefix
#: keeps a task apart from an ``@job`` of the same dotted name.
TASK_JOB_PREFIX = "tasks:"

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
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return False
    for params in tasks.values():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
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


def not_registered_message(job_name: str) -> str:
    """The dead-set error of a payload naming a task this worker does not know."""
    path = job_name[len(TASK_JOB_PREFIX) :]
    return (
        f"task {path!r} is not registered on this worker (job {job_name!r}): no @task with that module "
        "path was imported. Define it with @task in an installed app's tasks module (<app>/tasks.py, "
        "which the worker imports at startup) or in a module that one imports, with a TASKS backend "
        "that is django_cogworker.tasks.CogworkerBackend; then retry this job from the dead set. "
        "Nothing named in a payload is ever imported."
    )


def explain_unknown(job_name: str) -> str | None:
    """The registry's explainer: :func:`not_registered_message` for a task's job name."""
    return not_registered_message(job_name) if job_name.startswith(TASK_JOB_PREFIX) else None


registry.add_autodiscover_module("tasks", when=backend_configured)
registry.add_unknown_name_explainer(explain_unknown)
