"""A placeholder model, so that the jobs pages have an entry in the admin
index and Django's own permissions.

No table: the jobs live in Redis (``django_cogworker.api``). The model
exists only for ``django_cogworker.view_job`` (see the pages) and
``django_cogworker.change_job`` (retry, delete, kill, pause, clear, quiet,
stop), granted like any other model's permissions.
"""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    class Meta:
        managed = False
        default_permissions = ("view", "change")
        verbose_name = "job"
        verbose_name_plural = "jobs"
