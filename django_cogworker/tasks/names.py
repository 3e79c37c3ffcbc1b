"""A task's job name, ``tasks:<module path>``, and the dead-set error of a
payload naming a task that no module imported in the worker defines.

It imports nothing: the package (its registry hook), the backend and the
runner all read the name here, and the package, which loads the backend
only on first use, is imported back by no module of its own.
"""

from __future__ import annotations

#: Registry names of tasks: ``tasks:`` + the task's module path. The prefix
#: keeps a task apart from an ``@job`` of the same dotted name.
TASK_JOB_PREFIX = "tasks:"


def job_name(module_path: str) -> str:
    return TASK_JOB_PREFIX + module_path


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
