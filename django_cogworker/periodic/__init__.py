"""Periodic (cron) jobs: ``@periodic``, ``COGWORKER["PERIODIC"]`` and their ticker.

Every slot of every entry is enqueued exactly once across all processes, at
most a grace window late, never backfilled; an ``until_executed`` entry
skips a slot while its previous run is queued or running. By role:

- :mod:`.entry`: the :class:`Entry` type, its pjid, and
  :func:`setting_problems`, the one validator of an entry (the system
  checks use it too);
- :mod:`.enqueue`: one slot, pushed once across all processes;
- :mod:`.lock`: the running lock of an ``until_executed`` entry, and
  :class:`PeriodicLockMiddleware`, which holds it around the run;
- :mod:`.ticker`: the :class:`Ticker` thread of every worker process;
- here: the ``@periodic`` decorator and its entries, and :func:`entries`,
  what the ticker (through the loader the launcher hands it) and the admin
  list. The decorated entries live in this module so that
  ``django_cogworker.periodic._decorated`` is the one list.

The package exports the decorator, :func:`entries` and the middleware
(its path in ``MIDDLEWARE``); the rest is imported from its module, so that a
worker with no entries never loads the cron parser.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django_cogworker.conf import Config, get_config
from django_cogworker.job import Job

# Loaded by every worker anyway (the ticker; the middleware is a default):
# the path in MIDDLEWARE["server"] names it here.
from django_cogworker.periodic.lock import PeriodicLockMiddleware

if TYPE_CHECKING:
    from django_cogworker.periodic.entry import Entry  # the cron parser: loaded for entries only

__all__ = ["PeriodicLockMiddleware", "entries", "periodic"]

logger = logging.getLogger("django_cogworker")

_decorated: list[Entry] = []


def periodic(
    cron: str,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    tz: str = "UTC",
    until_executed: bool = False,
) -> Callable[[Job], Job]:
    """Runs a ``@job`` on a cron schedule; goes above ``@job`` and may be
    stacked for several schedules::

        @periodic("0 3 * * *", tz="Europe/Berlin")
        @job
        def nightly_report(): ...
    """

    def wrap(made: Job) -> Job:
        if not isinstance(made, Job):
            raise TypeError(f"@periodic decorates a @job, got {made!r}: put @periodic(...) above @job")
        value = {
            "cron": cron,
            "job": made.name,
            "args": list(args),
            "kwargs": dict(kwargs or {}),
            "queue": queue,
            "tz": tz,
            "until_executed": until_executed,
        }
        from django_cogworker.periodic.entry import parse_setting

        try:
            entry = parse_setting(value)
        except ValueError as exc:
            raise ValueError(f"@periodic on {made.name}: {exc}") from None
        if all(e.pjid != entry.pjid for e in _decorated):
            _decorated.append(entry)
        return made

    return wrap


def entries(config: Config | None = None, *, log: bool = False) -> list[Entry]:
    """The entries of the settings, then the decorated ones, without
    duplicates. A broken settings entry is left out (logged if ``log``)."""
    config = config or get_config()
    found: list[Entry] = []
    seen: set[str] = set()
    for index, value in enumerate(config.periodic):
        from django_cogworker.periodic.entry import parse_setting  # the cron parser: for entries only

        try:
            entry = parse_setting(value)
        except ValueError as exc:
            if log:
                logger.error("COGWORKER['PERIODIC'][%d] skipped: %s", index, exc)
            continue
        if entry.pjid not in seen:
            seen.add(entry.pjid)
            found.append(entry)
    for entry in _decorated:
        if entry.pjid not in seen:
            seen.add(entry.pjid)
            found.append(entry)
    return found
