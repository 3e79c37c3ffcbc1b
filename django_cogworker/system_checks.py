"""The system checks as Django's registry holds them: two small functions
that import the checks (``checks/``) only when the checks run. A worker
runs them in a forked child (``manage.py cogworker``), so what they import
takes no memory in the worker itself."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, register


@register("cogworker")
def cogworker_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from django_cogworker.checks import check_settings  # loaded by a run of the checks only

    return check_settings(app_configs, **kwargs)


@register("cogworker")
def cogworker_served_queues(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from django_cogworker.checks.queues import check_served_queues

    return check_served_queues(app_configs, **kwargs)
