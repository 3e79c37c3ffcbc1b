"""Checks of the dotted paths of ``COGWORKER``: ``MIDDLEWARE`` (E017),
``ERROR_HANDLERS`` (E018), and that each imports to a class or function (E019)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage
from django.utils.module_loading import import_string

from django_cogworker.checks.base import error


def check_dotted_paths(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    middleware = values["MIDDLEWARE"]
    paths: list[tuple[str, Any]] = []
    if not isinstance(middleware, dict) or set(middleware) - {"client", "server"}:
        errors.append(
            error(
                "COGWORKER['MIDDLEWARE'] must be a dict with the keys 'client' and 'server', "
                f"got {middleware!r}.",
                "For example {'client': [], 'server': ['myapp.middleware.Timing']}.",
                "cogworker.E017",
            )
        )
    else:
        for side in ("client", "server"):
            entries = middleware.get(side, [])
            if not isinstance(entries, list | tuple):
                errors.append(
                    error(
                        f"COGWORKER['MIDDLEWARE'][{side!r}] must be a list of dotted paths, got {entries!r}.",
                        "For example ['myapp.middleware.Timing'].",
                        "cogworker.E017",
                    )
                )
                continue
            paths += [(f"COGWORKER['MIDDLEWARE'][{side!r}]", p) for p in entries]
    handlers = values["ERROR_HANDLERS"]
    if not isinstance(handlers, list | tuple):
        errors.append(
            error(
                f"COGWORKER['ERROR_HANDLERS'] must be a list of dotted paths, got {handlers!r}.",
                "For example ['myapp.errors.report'].",
                "cogworker.E018",
            )
        )
    else:
        paths += [("COGWORKER['ERROR_HANDLERS']", p) for p in handlers]
    for where, path in paths:
        if not isinstance(path, str) or not path:
            problem = f"{path!r} is not a dotted path (a string)"
        else:
            try:
                target = import_string(path)
            except Exception as exc:
                problem = f"cannot import {path!r} ({exc})"
            else:
                if callable(target):
                    continue
                problem = f"{path!r} is a {type(target).__name__}, not a class or function"
        errors.append(
            error(f"{where}: {problem}.", "Give the dotted path of a class or function.", "cogworker.E019")
        )
    return errors
