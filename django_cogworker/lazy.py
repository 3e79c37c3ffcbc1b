"""Names a package exports, imported at their first use (PEP 562).

A worker process holds every module it imports for its whole life: a
feature it never uses (workflows, cron schedules) should cost it nothing.
The package's ``__init__`` names what it exports and where each name lives;
``from django_cogworker import chain`` then imports the module of ``chain``
at that moment, and keeps the name in the package for the next use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``where`` is
    taken from its module (``where[name]``, relative to ``package``) when
    first asked for."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
