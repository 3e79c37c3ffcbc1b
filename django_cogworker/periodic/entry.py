"""A periodic entry: its type, its identity and the one validator of ``PERIODIC``.

Duties:
- :class:`Entry`, frozen: cron, job name, arguments, queue, time zone and
  ``until_executed``, with its :class:`~django_cogworker.cron.Schedule` and
  its pjid, a hash of job, cron, args, kwargs, queue and time zone, so that
  every process names an entry alike (``until_executed`` is not part of it:
  turning it on keeps the slots);
- :func:`setting_problems`, everything wrong with one entry of
  ``COGWORKER["PERIODIC"]`` or of a ``@periodic``: the only copy of the
  rules. The system checks report its problems (E020, E022, E023);
  :func:`parse_setting` refuses an entry with them, and so do ``@periodic``
  and the ticker when it reads the settings. The rules of a cron expression
  and a time zone themselves live in :mod:`django_cogworker.cron`, which
  :class:`~django_cogworker.cron.Schedule` applies too;
- :func:`entry_queue`: the queue an entry's slots go to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django_cogworker import registry
from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.cron import Schedule, cron_error, normalise_cron, tz_error
from django_cogworker.escaping import utf8
from django_cogworker.payload import check_arguments

#: The keys an entry may have ("cron" and "job" are required).
SETTING_KEYS = ("cron", "job", "args", "kwargs", "queue", "tz", "until_executed")

# The kinds of problem; the system checks give each kind its id.
SHAPE = "shape"  # a key or value an entry cannot have (E020)
UNREGISTERED = "unregistered"  # 'job' names no registered job (E020)
SCHEDULE = "schedule"  # a cron croniter reads but the ticker cannot use (E022)
ARGUMENTS = "arguments"  # arguments JSON cannot carry (E023)

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class Entry:
    cron: str
    job: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    tz: str = "UTC"
    until_executed: bool = False
    schedule: Schedule = field(init=False, repr=False, compare=False)
    pjid: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", normalise_cron(self.cron))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "schedule", Schedule(self.cron, self.tz))
        identity = [self.job, self.cron, list(self.args), self.kwargs, self.queue, self.tz]
        pjid = hashlib.sha256(utf8(_canonical.encode(identity))).hexdigest()[:32]
        object.__setattr__(self, "pjid", pjid)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a ``PERIODIC`` entry."""

    kind: str
    #: What the system check says (its exact words are part of its contract).
    message: str
    #: The schedule's own reason (:func:`~django_cogworker.cron.cron_error`,
    #: :func:`~django_cogworker.cron.tz_error`) where it says more than
    #: ``message``: what ``@periodic`` and the ticker's log say.
    detail: str = ""

    def __str__(self) -> str:
        return self.detail or self.message


def setting_problems(value: Any) -> list[Problem]:
    """Everything wrong with one ``PERIODIC`` entry, in the order of its
    keys; empty when it is fine."""
    if not isinstance(value, dict):
        return [Problem(SHAPE, f"must be a dict, got {value!r}")]
    unknown = sorted(set(value) - set(SETTING_KEYS), key=str)
    problems = [Problem(SHAPE, f"unknown key {key!r}") for key in unknown]
    problems += _cron_problems(value.get("cron"))
    name = value.get("job")
    if not isinstance(name, str) or not name:
        problems.append(Problem(SHAPE, f"'job' must be the name of a registered job, got {name!r}"))
    elif registry.get(name) is None:
        problems.append(
            Problem(
                UNREGISTERED,
                f"'job' {name!r} is not a registered job (a @job function of an installed app's jobs module)",
            )
        )
    problems += _argument_problems(name, value.get("args", []), value.get("kwargs", {}))
    queue = value.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        problems.append(Problem(SHAPE, f"'queue' must be a queue name or None, got {queue!r}"))
    tz = value.get("tz", "UTC")
    reason = tz_error(tz)
    if reason:
        problems.append(
            Problem(
                SHAPE,
                f"'tz' must be an IANA time zone name such as 'Europe/Paris', got {tz!r}",
                detail=f"'tz' {tz!r} {reason}",
            )
        )
    until_executed = value.get("until_executed", False)
    if not isinstance(until_executed, bool):
        problems.append(Problem(SHAPE, f"'until_executed' must be True or False, got {until_executed!r}"))
    return problems


def _cron_problems(cron: Any) -> list[Problem]:
    if not isinstance(cron, str) or not cron.strip():
        return [Problem(SHAPE, f"'cron' must be a cron expression such as '*/5 * * * *', got {cron!r}")]
    reason = cron_error(cron)
    if reason is None:
        return []
    detail = f"'cron' {cron!r} {reason}"
    if _croniter_reads(cron):
        # Seven fields, or a date that never comes: valid to croniter, and
        # so to a reader of the settings, but never a slot for the ticker.
        return [Problem(SCHEDULE, detail)]
    return [Problem(SHAPE, f"'cron' {cron!r} is not a valid cron expression", detail=detail)]


def _croniter_reads(cron: str) -> bool:
    from croniter import croniter

    try:
        return bool(croniter.is_valid(cron))
    except (ValueError, TypeError, KeyError):  # what croniter raises besides CroniterError
        return False


def _argument_problems(name: Any, args: Any, kwargs: Any) -> list[Problem]:
    problems: list[Problem] = []
    if not isinstance(args, list | tuple):
        problems.append(Problem(SHAPE, f"'args' must be a list, got {args!r}"))
    if not isinstance(kwargs, dict):
        problems.append(Problem(SHAPE, f"'kwargs' must be a dict, got {kwargs!r}"))
    elif not all(isinstance(k, str) for k in kwargs):
        problems.append(Problem(ARGUMENTS, "'kwargs' must be a dict with string keys"))
    if problems:
        return problems
    try:
        check_arguments(name if isinstance(name, str) else "?", list(args), kwargs)
    except TypeError as exc:
        return [Problem(ARGUMENTS, str(exc))]
    return []


def parse_setting(value: Any) -> Entry:
    """An entry of ``COGWORKER["PERIODIC"]``; ValueError says what is wrong.

    A job that is not registered is no reason to refuse the entry: the
    system check reports it at startup, and the ticker at each slot (G12).
    """
    problems = [p for p in setting_problems(value) if p.kind != UNREGISTERED]
    if problems:
        raise ValueError("; ".join(str(p) for p in problems))
    return Entry(
        cron=value["cron"],
        job=value["job"],
        args=tuple(value.get("args", ())),
        kwargs=dict(value.get("kwargs") or {}),
        queue=value.get("queue"),
        tz=value.get("tz", "UTC"),
        until_executed=value.get("until_executed", False),
    )


def entry_queue(entry: Entry) -> str:
    """The queue an entry's slots go to: its own, else its job's."""
    job = registry.get(entry.job)
    return entry.queue or (job.queue if job is not None else DEFAULT_QUEUE)
