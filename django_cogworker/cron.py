"""Cron schedules as pure functions of the time, on croniter.

An expression has five fields (minute, hour, day of month, month, day of
week), or a croniter nickname such as ``@daily``; a sixth field, seconds,
last, is accepted as an extension (for tests and demos). It is read in an
IANA time zone, and times in and out are epoch seconds, so every process
names a slot alike. When clocks go back, an expression with fixed hours
fires in the first pass through the repeated hour only (a time of day
happens once), while one whose hour field is ``*`` fires in both (it is
about intervals); when they go forward, a time inside the gap fires at the
jump (croniter's rule, as cron's).

croniter (and dateutil under it) is imported on first use: a worker with no
periodic entries never loads it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from croniter import croniter

#: get_prev() is strict: look from just after ``now`` so that a slot is due
#: at its own second.
_EPSILON_S = 1e-6


def normalise_cron(cron: str) -> str:
    return " ".join(cron.split())


def cron_error(cron: Any) -> str | None:
    """What is wrong with a cron expression, or None."""
    if not isinstance(cron, str) or not cron.strip():
        return "must be a non-empty string such as '*/5 * * * *'"
    cron = normalise_cron(cron)
    fields = cron.split(" ")
    if not cron.startswith("@") and len(fields) not in (5, 6):
        return (
            f"has {len(fields)} fields; use five (minute hour day-of-month month day-of-week), "
            "or six with seconds last"
        )
    from croniter import CroniterBadDateError, CroniterError, croniter

    try:
        croniter(cron, datetime(2000, 1, 1, tzinfo=ZoneInfo("UTC"))).get_next(datetime)
    except CroniterBadDateError:
        return "never fires: no date matches it (such as the 30th of February)"
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        return f"is not a valid cron expression ({exc})"
    return None


def tz_error(tz: Any) -> str | None:
    """What is wrong with a time zone name, or None."""
    if not isinstance(tz, str) or not tz:
        return "must be an IANA time zone name such as 'UTC' or 'Europe/Berlin'"
    try:
        ZoneInfo(tz)
    except Exception:
        return "is not a known IANA time zone (such as 'UTC' or 'Europe/Berlin')"
    return None


class Schedule:
    """A cron expression in a time zone. Times are epoch seconds."""

    def __init__(self, cron: str, tz: str = "UTC") -> None:
        problem = cron_error(cron)
        if problem:
            raise ValueError(f"cron {cron!r} {problem}")
        problem = tz_error(tz)
        if problem:
            raise ValueError(f"tz {tz!r} {problem}")
        self.cron = normalise_cron(cron)
        self.tz = tz
        self.zone = ZoneInfo(tz)
        # An entry that fires every hour runs in both passes through a
        # repeated hour (it is about intervals); one with fixed hours is
        # about a time of day, which happens once.
        self.every_hour = _croniter()(self.cron).expanded[1] == ["*"]

    def __repr__(self) -> str:
        return f"<Schedule {self.cron!r} {self.tz}>"

    def _iter(self, at: float) -> croniter:
        return _croniter()(self.cron, datetime.fromtimestamp(at, self.zone))

    def _second_pass(self, fire: datetime) -> bool:
        return not self.every_hour and fire.fold == 1 and fire.replace(fold=0).utcoffset() != fire.utcoffset()

    def due_slot(self, now: float, grace_s: float) -> float | None:
        """The latest fire time in (now - grace_s, now], or None."""
        it = self._iter(now + _EPSILON_S)
        while True:
            fire = it.get_prev(datetime)
            at = fire.timestamp()
            if now - at >= grace_s:
                return None
            if not self._second_pass(fire):
                return at

    def next_run(self, now: float) -> float:
        """The first fire time after ``now``."""
        it = self._iter(now)
        while True:
            fire = it.get_next(datetime)
            if not self._second_pass(fire):
                return fire.timestamp()

    def runs(self, start: float, end: float) -> list[float]:
        """Every fire time in (start, end]: what the ticker enqueues when it
        never misses a slot."""
        found: list[float] = []
        at = start
        while True:
            at = self.next_run(at)
            if at > end:
                return found
            found.append(at)


def _croniter() -> type[croniter]:
    from croniter import croniter

    return croniter
