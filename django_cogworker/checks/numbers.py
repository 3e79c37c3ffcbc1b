"""Checks of the numbers of ``COGWORKER``: durations and counts (E003-E005),
and the intervals that must fit together (E006, E007)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage

from django_cogworker.checks.base import NUMBER, error
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
)
POSITIVE_INTS = ("CONCURRENCY", "DEAD_MAX_JOBS")
NON_NEGATIVE_INTS = ("MAX_ORPHANINGS", "DEFAULT_RETRY", "ENQUEUE_WAIT_REPLICAS")


def check_numbers(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for key in POSITIVE_NUMBERS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, NUMBER) or v <= 0:
            errors.append(
                error(
                    f"COGWORKER[{key!r}] must be a positive number of seconds, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E003",
                )
            )
    for key in POSITIVE_INTS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            errors.append(
                error(
                    f"COGWORKER[{key!r}] must be a whole number of at least 1, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E004",
                )
            )
    for key in NON_NEGATIVE_INTS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            errors.append(
                error(
                    f"COGWORKER[{key!r}] must be a whole number of at least 0, got {v!r}.",
                    f"The default is {DEFAULTS[key]!r}.",
                    "cogworker.E005",
                )
            )
    v = values["SHUTDOWN_TIMEOUT"]
    if isinstance(v, bool) or not isinstance(v, NUMBER) or v < 0:
        errors.append(
            error(
                f"COGWORKER['SHUTDOWN_TIMEOUT'] must be a number of seconds >= 0, got {v!r}.",
                "The default is 25.",
                "cogworker.E003",
            )
        )
    return errors


def check_intervals(values: dict[str, Any]) -> list[CheckMessage]:
    beat, ttl, threshold = values["HEARTBEAT_INTERVAL"], values["HEARTBEAT_TTL"], values["ORPHAN_THRESHOLD"]
    if not all(isinstance(v, NUMBER) and not isinstance(v, bool) for v in (beat, ttl, threshold)):
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
