"""django-cogworker: reliable background jobs for Django, on Redis."""

from django_cogworker.context import current_job
from django_cogworker.job import Job
from django_cogworker.registry import job

__all__ = ["Job", "current_job", "job"]
__version__ = "0.1.0"
