"""The registry: job names to functions.

A worker runs only what ``@job`` registered, found by autodiscovering every
installed app's ``jobs`` module at startup. Nothing is ever imported from a
name found in a payload.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from django_cogworker.job import Job

logger = logging.getLogger("django_cogworker")

_jobs: dict[str, Job] = {}


def register(job: Job) -> None:
    existing = _jobs.get(job.name)
    if existing is not None and existing.func is not job.func:
        logger.warning("job name %r registered twice; the later definition wins", job.name)
    _jobs[job.name] = job


def get(name: str) -> Job | None:
    return _jobs.get(name)


def names() -> list[str]:
    return sorted(_jobs)


def autodiscover() -> None:
    autodiscover_modules("jobs")
    # Apps' tasks modules register their @task functions as they are
    # imported; only when TASKS selects the cogworker backend, since a
    # tasks.py may belong to another library (Celery's).
    from django_cogworker.tasks import backend_configured

    if backend_configured():
        autodiscover_modules("tasks")
