"""The registry: job names to functions, and ``@job``, which registers one.

A worker runs only what ``@job`` registered, found by autodiscovering every
installed app's ``jobs`` module at startup. Nothing is ever imported from a
name found in a payload.

Extensions (this package's Tasks backend) plug in here rather than being
imported by the core: :func:`add_autodiscover_module` names another module
to import from every app at startup, and :func:`add_unknown_name_explainer`
words the dead-set error of a payload naming a job this process does not
know (G13). The backends named in Django's ``TASKS`` setting are imported
first, so that such a backend adds its hooks before the apps' modules are
imported, and so before a worker runs its first job.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, Literal, overload

from django.conf import settings
from django.utils.module_loading import autodiscover_modules

from django_cogworker.job import Job, OnExhausted, RetryIn

logger = logging.getLogger("django_cogworker")

#: ``(job name) -> message``, or None when the name is not its to explain.
Explainer = Callable[[str], str | None]

_jobs: dict[str, Job] = {}
_explainers: list[Explainer] = []
#: Module name -> the condition, read at autodiscovery, under which apps'
#: modules of that name are imported (None: always).
_modules: dict[str, Callable[[], bool] | None] = {"jobs": None}


#: The names of the registered jobs with a ``limit``: while it is empty (and
#: ``QUEUE_LIMITS`` too), a worker looks at no job's limiters.
limited: set[str] = set()


def register(job: Job) -> None:
    existing = _jobs.get(job.name)
    if existing is not None and existing.func is not job.func:
        logger.warning("job name %r registered twice; the later definition wins", job.name)
    _jobs[job.name] = job
    if job.limit is not None:
        limited.add(job.name)
    else:
        limited.discard(job.name)


@overload
def job(func: Callable[..., Any], /) -> Job: ...


@overload
def job(
    *,
    queue: str = ...,
    retry: bool | int = ...,
    dead: bool = ...,
    retry_in: RetryIn | None = ...,
    on_exhausted: OnExhausted | None = ...,
    unique_for: float | None = ...,
    unique_until: Literal["success", "start"] = ...,
    timeout: float | None = ...,
    hard_timeout: float | None = ...,
    expires: float | None = ...,
    limit: Any = ...,
    name: str | None = ...,
) -> Callable[[Callable[..., Any]], Job]: ...


def job(func: Callable[..., Any] | None = None, /, *, name: str | None = None, **options: Any) -> Any:
    """Register a function as a job: ``@job`` or ``@job(queue=..., retry=...)``."""

    def wrap(f: Callable[..., Any]) -> Job:
        made = Job(func=f, name=name or f"{f.__module__}.{f.__qualname__}", **options)
        dataclasses_update_wrapper(made, f)
        register(made)
        return made

    return wrap(func) if func is not None else wrap


def dataclasses_update_wrapper(made: Job, func: Callable[..., Any]) -> None:
    # A frozen dataclass refuses setattr; the docstring is still worth keeping.
    object.__setattr__(made, "__doc__", func.__doc__)


def get(name: str) -> Job | None:
    return _jobs.get(name)


def is_coroutine(name: str) -> bool:
    """Whether ``name`` is a registered ``async def`` job."""
    job = _jobs.get(name)
    return job is not None and job.coroutine


def names() -> list[str]:
    return sorted(_jobs)


def has_coroutine_jobs() -> bool:
    """Whether this process registered an ``async def`` job: only then does
    a worker start (and load) the event loop of ``coroutines.py``."""
    return any(job.coroutine for job in _jobs.values())


def add_unknown_name_explainer(explainer: Explainer) -> None:
    """Lets ``explainer`` word the error of a payload naming an unknown job
    (the first one that answers wins). Adding the same one again does nothing."""
    if explainer not in _explainers:
        _explainers.append(explainer)


def not_registered_message(name: str) -> str:
    """Why a payload naming ``name`` cannot run here: filed in dead with it."""
    for explainer in _explainers:
        message = explainer(name)
        if message is not None:
            return message
    imported = [m for m, when in _modules.items() if when is None or when()]
    modules = " and ".join(f"{m}.py" for m in sorted(imported))
    # The module is read off the name, never imported (payloads are untrusted).
    module, dot, _ = name.rpartition(".")
    if dot and module.rpartition(".")[2] not in imported:
        where = (
            f"Its name points to the module {module!r}, which the worker does not import: it imports "
            f"only the {modules} of each installed app (and what those import). Move the job into its "
            f"app's {modules.split(' and ')[0]}, or import it from there; then restart the worker (in "
            "development, run it with --reload)"
        )
    else:
        where = (
            f"The worker imports the {modules} of each installed app at start, and found no @job of "
            "that name there. If the job was added or renamed since, restart the worker (in "
            "development, run it with --reload)"
        )
    return (
        f"job {name!r} is not registered in this worker. {where}, and retry this job from the Dead page "
        "of the admin. The worker's start line at -v 2 lists the jobs it registered."
    )


def add_autodiscover_module(name: str, *, when: Callable[[], bool] | None = None) -> None:
    """Imports every installed app's module ``name`` at startup, as its
    ``jobs`` module is; ``when`` (read then) makes it conditional. Takes
    effect in :func:`autodiscover`, so call it before that runs: at import
    of a module that Django's settings name (a ``TASKS`` backend's)."""
    _modules[name] = when


def autodiscover() -> None:
    _import_task_backends()
    for name, when in list(_modules.items()):
        if when is None or when():
            autodiscover_modules(name)


def task_backend_paths() -> list[str]:
    """The dotted paths of the backends that ``TASKS`` names, but Django's
    own: those (Django 6 names its ImmediateBackend when ``TASKS`` is unset)
    build on nothing of ours, so a worker leaves them, and ``django.tasks``
    with them (0.4 MB), to the code that uses them."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return []
    paths = (params.get("BACKEND") if isinstance(params, dict) else None for params in tasks.values())
    return [p for p in paths if isinstance(p, str) and "." in p and not p.startswith("django.")]


def _import_task_backends() -> None:
    """Imports the module of every backend ``TASKS`` names, so that one
    built on cogworker has added its hooks before the modules are imported.

    Only the module: the backend itself is made by Django when first used.
    A path that does not import is skipped here; Django reports it when the
    backend is used, and the Tasks framework's checks name it."""
    for path in task_backend_paths():
        try:
            importlib.import_module(path.rpartition(".")[0])
        except Exception as exc:
            logger.debug("TASKS backend %s did not import (%s)", path, exc)
