"""Checks of ``COGWORKER["PERIODIC"]``, with the one validator of an entry,
:func:`django_cogworker.periodic.entry.setting_problems`: what an entry
cannot hold (E020), then, in an entry without those, a cron croniter reads
but the ticker cannot use (E022) and arguments JSON cannot carry (E023)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage

from django_cogworker.checks.base import error
from django_cogworker.periodic.entry import (
    ARGUMENTS,
    SCHEDULE,
    SETTING_KEYS,
    SHAPE,
    UNREGISTERED,
    setting_problems,
)

#: The problems of a PERIODIC entry that E020 reports, with its hint. The
#: others are reported only for an entry without these, with their own id.
PERIODIC_E020 = (SHAPE, UNREGISTERED)
PERIODIC_HINT = (
    f'An entry is a dict with the keys {", ".join(SETTING_KEYS)} (only "cron" and "job" are required).'
)
PERIODIC_LATER = {
    # A cron croniter accepts but the ticker does not (seven fields, a date
    # that never comes).
    SCHEDULE: (
        "Five fields: minute hour day-of-month month day-of-week (a sixth, seconds, may follow), "
        "or @hourly, @daily...",
        "cogworker.E022",
    ),
    ARGUMENTS: ("Pass plain JSON values (str, int, float, bool, None, list, dict).", "cogworker.E023"),
}


def check_periodic(values: dict[str, Any]) -> list[CheckMessage]:
    entries = values["PERIODIC"]
    if not isinstance(entries, list | tuple):
        return [
            error(
                f"COGWORKER['PERIODIC'] must be a list of entries, got {entries!r}.",
                'For example [{"cron": "*/5 * * * *", "job": "myapp.jobs.cleanup"}].',
                "cogworker.E020",
            )
        ]
    found = [(f"COGWORKER['PERIODIC'][{i}]", setting_problems(entry)) for i, entry in enumerate(entries)]
    errors: list[CheckMessage] = []
    for where, problems in found:
        for problem in problems:
            if problem.kind in PERIODIC_E020:
                errors.append(error(f"{where}: {problem.message}.", PERIODIC_HINT, "cogworker.E020"))
    for where, problems in found:
        if any(p.kind in PERIODIC_E020 for p in problems):
            continue
        for problem in problems:
            hint, id_ = PERIODIC_LATER[problem.kind]
            errors.append(error(f"{where}: {problem.message}.", hint, id_))
    return errors
