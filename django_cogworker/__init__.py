"""django-cogworker: reliable background jobs for Django, on Redis."""

from typing import TYPE_CHECKING

from django_cogworker.context import current_job
from django_cogworker.job import Job
from django_cogworker.lazy import exports
from django_cogworker.registry import job

if TYPE_CHECKING:
    from django_cogworker.workflows.batch import batch, current_batch
    from django_cogworker.workflows.canvas import chain, chord, group
    from django_cogworker.workflows.signature import Signature

__all__ = ["Job", "Signature", "batch", "chain", "chord", "current_batch", "current_job", "group", "job"]
__version__ = "0.1.0"

# Workflows are imported when first used: a worker that runs none does not hold them.
__getattr__ = exports(
    __name__,
    {
        "batch": ".workflows.batch",
        "current_batch": ".workflows.batch",
        "chain": ".workflows.canvas",
        "chord": ".workflows.canvas",
        "group": ".workflows.canvas",
        "Signature": ".workflows.signature",
    },
)
