"""django-cogworker: reliable background jobs for Django, on Redis."""

from django_cogworker.context import current_job
from django_cogworker.job import Job
from django_cogworker.registry import job
from django_cogworker.workflows.batch import batch, current_batch
from django_cogworker.workflows.canvas import chain, chord, group
from django_cogworker.workflows.signature import Signature

__all__ = ["Job", "Signature", "batch", "chain", "chord", "current_batch", "current_job", "group", "job"]
__version__ = "0.1.0"
