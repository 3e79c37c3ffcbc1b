"""Checks of what a worker fetches and how: ``QUEUES`` (E013, E014, the rule
itself in :func:`django_cogworker.conf.queue_list_problems`), ``FETCH``
(E015, the names of :data:`django_cogworker.fetch.STRATEGIES`),
``ENQUEUE_ON_COMMIT`` and ``FAST_PATH`` (E016), ``CPU_AFFINITY`` (E028)
and ``QUEUE_LIMITS`` (E034);
and the one warning (W001): a job or periodic entry whose queue ``QUEUES``
does not list, whose jobs a worker started without ``-q`` would never fetch."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Warning

from django_cogworker import registry
from django_cogworker.affinity import AUTO
from django_cogworker.checks.base import error, is_whole
from django_cogworker.conf import DEFAULTS, QueueSpec, get_config, parse_queue, queue_list_problems
from django_cogworker.fetch import STRATEGIES
from django_cogworker.periodic.entry import entry_queue, parse_setting

#: The switches (E016).
BOOLS = ("ENQUEUE_ON_COMMIT", "FAST_PATH")


def check_queues_and_modes(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    queues = values["QUEUES"]
    if not isinstance(queues, list | tuple) or not queues:
        errors.append(
            error(
                f"COGWORKER['QUEUES'] must be a non-empty list, got {queues!r}.",
                "For example ['default'] or ['critical,3', 'default,1'].",
                "cogworker.E013",
            )
        )
    else:
        specs: list[QueueSpec] = []
        for q in queues:
            if not isinstance(q, str):
                errors.append(
                    error(
                        f"COGWORKER['QUEUES']: {q!r} is not a string.",
                        "Use 'name' or 'name,weight'.",
                        "cogworker.E013",
                    )
                )
                continue
            try:
                specs.append(parse_queue(q))
            except ValueError as exc:
                errors.append(
                    error(f"COGWORKER['QUEUES']: {exc}.", "Use 'name' or 'name,weight'.", "cogworker.E013")
                )
        problems = queue_list_problems(specs)
        for name in problems.repeated:
            errors.append(
                error(
                    f"COGWORKER['QUEUES'] lists the queue {name!r} more than once.",
                    "Name each queue once; give it a weight to make it fetched more often.",
                    "cogworker.E013",
                )
            )
        if problems.mixed:
            errors.append(
                error(
                    "COGWORKER['QUEUES'] mixes weighted and unweighted queues.",
                    "Give every queue a weight, or none (strict order).",
                    "cogworker.E014",
                )
            )
    if values["FETCH"] not in STRATEGIES:
        errors.append(
            error(
                f"COGWORKER['FETCH'] must be {' or '.join(map(repr, STRATEGIES))}, got {values['FETCH']!r}.",
                "'reliable' is the default and loses no job when a worker dies.",
                "cogworker.E015",
            )
        )
    for key in BOOLS:
        if not isinstance(values[key], bool):
            errors.append(
                error(
                    f"COGWORKER[{key!r}] must be True or False, got {values[key]!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E016",
                )
            )
    if not cpu_affinity_valid(values["CPU_AFFINITY"]):
        errors.append(
            error(
                f"COGWORKER['CPU_AFFINITY'] must be None, 'auto' or a non-empty list of CPU numbers, "
                f"got {values['CPU_AFFINITY']!r}.",
                "None (the default) leaves the CPUs to the OS; 'auto' pins each worker process, "
                "and everything its jobs start, to one CPU.",
                "cogworker.E028",
            )
        )
    errors += check_queue_limits(values.get("QUEUE_LIMITS", {}))
    return errors


def check_queue_limits(value: Any) -> list[CheckMessage]:
    """E034: ``QUEUE_LIMITS`` maps queue names to whole numbers >= 1."""
    hint = "For example {'reports': 1}: at most one job of the queue 'reports' at once, across every worker."
    if not isinstance(value, dict):
        return [error(f"COGWORKER['QUEUE_LIMITS'] must be a dict, got {value!r}.", hint, "cogworker.E034")]
    return [
        error(
            f"COGWORKER['QUEUE_LIMITS'][{queue!r}] = {n!r}: the key must be a queue's name and the value a "
            "whole number >= 1.",
            hint,
            "cogworker.E034",
        )
        for queue, n in value.items()
        if not (isinstance(queue, str) and queue and is_whole(n, 1))
    ]


def cpu_affinity_valid(value: Any) -> bool:
    if value is None or value == AUTO:
        return True
    return isinstance(value, list | tuple) and bool(value) and all(is_whole(cpu, 0) for cpu in value)


def check_served_queues(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W001, one per queue: the ``@job`` functions and ``PERIODIC`` entries
    that push to a queue ``QUEUES`` does not list. A warning, not an error:
    a worker started with ``-q`` may serve it (then silence it)."""
    try:
        config = get_config()
    except Exception:
        return []  # the errors of check_settings say what is wrong
    served = {q.name for q in config.queues}
    users: dict[str, list[str]] = {}
    for name in registry.names():
        job = registry.get(name)
        # A name with a colon is an extension's: the Tasks backend's
        # "tasks:" jobs, whose queues cogworker.tasks.W001 checks.
        if job is not None and ":" not in name and job.queue not in served:
            users.setdefault(job.queue, []).append(f"@job {name}")
    for i, value in enumerate(config.periodic):
        try:
            queue = entry_queue(parse_setting(value))
        except (ValueError, TypeError, AttributeError):
            continue  # E020 reports it
        if queue not in served:
            users.setdefault(queue, []).append(f"COGWORKER['PERIODIC'][{i}] ({value['job']})")
    listed = ", ".join(repr(q.name) for q in config.queues)
    return [
        Warning(
            f"The queue {queue!r} is not in COGWORKER['QUEUES'], so a worker started without -q never "
            f"fetches it, and what is pushed there waits: {', '.join(who)}.",
            hint=f"Add it: COGWORKER['QUEUES'] = [{listed}, {queue!r}]; or, if workers started with "
            f"-q {queue} serve it, silence this check: SILENCED_SYSTEM_CHECKS = ['cogworker.W001'].",
            obj="COGWORKER",
            id="cogworker.W001",
        )
        for queue, who in sorted(users.items())
    ]
