from django.db import models
from django.utils import timezone


class JobResult(models.Model):
    """One line per finished run of a demo job, written by the job itself."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"

    jid = models.CharField("job id", max_length=64, db_index=True)
    job = models.CharField("job name", max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices)
    detail = models.TextField(blank=True)
    finished_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-finished_at", "-id"]
        verbose_name = "job result"

    def __str__(self) -> str:
        return f"{self.job} {self.jid}: {self.status}"
