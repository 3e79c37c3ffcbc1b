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


class Module:
    """A module imported at its first attribute read: for a module that
    only some settings use (the sharded layout's calls), named once at the
    top of the module that calls it::

        if TYPE_CHECKING:
            from django_cogworker.limits import sharded
        else:
            sharded = lazy.Module("django_cogworker.limits.sharded")
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.name!r}>"
