"""Checks of the numbers of ``COGWORKER``: durations and counts (E003-E005),
and the intervals that must fit together (E006, E007)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.checks import CheckMessage

from django_cogworker.checks.base import error, is_number, is_whole
from django_cogworker.conf import DEFAULTS

POSITIVE_NUMBERS = (
    "ORPHAN_THRESHOLD",
    "ORPHAN_CHECK_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TTL",
    "FETCH_IDLE_MAX_INTERVAL",
    "POLL_INTERVAL",
    "DEAD_TIMEOUT",
    "ENQUEUE_WAIT_TIMEOUT",
    "BATCH_TTL",
    "BATCH_DONE_TTL",
)
POSITIVE_INTS = ("CONCURRENCY", "ASYNC_CONCURRENCY", "DEAD_MAX_JOBS", "BATCH_RESULT_MAX_BYTES")
NON_NEGATIVE_INTS = ("MAX_ORPHANINGS", "DEFAULT_RETRY", "ENQUEUE_WAIT_REPLICAS")


#: Each rule: the settings it covers, what their value must be, when a value
#: is refused (a bool never passes), and the check id.
RULES: tuple[tuple[tuple[str, ...], str, Callable[[Any], bool], str], ...] = (
    (
        POSITIVE_NUMBERS,
        "a positive number of seconds",
        lambda v: not is_number(v) or v <= 0,
        "cogworker.E003",
    ),
    (POSITIVE_INTS, "a whole number of at least 1", lambda v: not is_whole(v, 1), "cogworker.E004"),
    (NON_NEGATIVE_INTS, "a whole number of at least 0", lambda v: not is_whole(v, 0), "cogworker.E005"),
    (
        ("SHUTDOWN_TIMEOUT",),
        "a number of seconds >= 0",
        lambda v: not is_number(v) or v < 0,
        "cogworker.E003",
    ),
)


def check_numbers(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for keys, must, refused, id_ in RULES:
        for key in (k for k in keys if refused(values[k])):
            message = f"COGWORKER[{key!r}] must be {must}, got {values[key]!r}."
            errors.append(error(message, f"The default is {DEFAULTS[key]!r}.", id_))
    return errors


def check_intervals(values: dict[str, Any]) -> list[CheckMessage]:
    beat, ttl, threshold = values["HEARTBEAT_INTERVAL"], values["HEARTBEAT_TTL"], values["ORPHAN_THRESHOLD"]
    if not all(is_number(v) for v in (beat, ttl, threshold)):
        return []
    errors: list[CheckMessage] = []
    if ttl <= beat:
        errors.append(
            error(
                f"COGWORKER['HEARTBEAT_TTL'] ({ttl}) must be longer than HEARTBEAT_INTERVAL ({beat}).",
                "Otherwise a live process's presence key expires between two beats; use at least 3 beats.",
                "cogworker.E006",
            )
        )
    if threshold < ttl:
        errors.append(
            error(
                f"COGWORKER['ORPHAN_THRESHOLD'] ({threshold}) must be at least HEARTBEAT_TTL ({ttl}).",
                "A shorter threshold would take the jobs of a live but briefly silent process.",
                "cogworker.E007",
            )
        )
    return errors
