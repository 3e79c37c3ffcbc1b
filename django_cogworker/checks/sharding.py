"""Checks of ``SHARDING`` and ``QUEUE_GROUPS`` (SPEC section 16): E035 for
the mode (its value, a Cluster URL, a namespace without braces), E036 for
the groups (a dict of names to lists of queues, each queue in one group)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage

from django_cogworker import redis_url
from django_cogworker.checks.base import error

#: The values of ``SHARDING``: off, or a hash tag per queue group.
MODES = (None, "queues")

GROUPS_HINT = "For example {'mail': ['mail', 'mail_bulk']}: both queues keep their keys in one slot."


def check_sharding(values: dict[str, Any]) -> list[CheckMessage]:
    return _check_mode(values) + _check_groups(values["QUEUE_GROUPS"])


def _check_mode(values: dict[str, Any]) -> list[CheckMessage]:
    mode = values["SHARDING"]
    if mode not in MODES:
        return [
            error(
                f"COGWORKER['SHARDING'] must be None or 'queues', got {mode!r}.",
                "'queues' spreads the queues over the masters of a Redis Cluster; None keeps one slot.",
                "cogworker.E035",
            )
        ]
    if mode is None:
        return []
    errors: list[CheckMessage] = []
    try:
        cluster = redis_url.parse(values["REDIS_URL"]).kind == redis_url.CLUSTER
    except ValueError:
        cluster = True  # E008 says what is wrong with the URL
    if not cluster:
        errors.append(
            error(
                "COGWORKER['SHARDING'] = 'queues' spreads queues over the masters of a Redis Cluster, "
                "and REDIS_URL names no cluster.",
                "Use a redis+cluster:// URL, or leave SHARDING out.",
                "cogworker.E035",
            )
        )
    ns = values["NAMESPACE"]
    if isinstance(ns, str) and ("{" in ns or "}" in ns):
        errors.append(
            error(
                f"COGWORKER['NAMESPACE'] = {ns!r} has braces: under SHARDING each queue group's "
                "keys get a hash tag of their own, and the shared keys '{N}'.",
                f"Use {ns.replace('{', '').replace('}', '')!r}, or leave NAMESPACE out ('cogworker').",
                "cogworker.E035",
            )
        )
    return errors


def _check_groups(value: Any) -> list[CheckMessage]:
    if not isinstance(value, dict):
        message = f"COGWORKER['QUEUE_GROUPS'] must be a dict, got {value!r}."
        return [error(message, GROUPS_HINT, "cogworker.E036")]
    errors: list[CheckMessage] = []
    seen: dict[str, object] = {}
    for group, queues in value.items():
        if not isinstance(group, str) or not group or not isinstance(queues, list | tuple) or not queues:
            errors.append(
                error(
                    f"COGWORKER['QUEUE_GROUPS'][{group!r}] = {queues!r}: the key must be a group's name "
                    "and the value a non-empty list of queue names.",
                    GROUPS_HINT,
                    "cogworker.E036",
                )
            )
            continue
        for queue in queues:
            if not isinstance(queue, str) or not queue:
                errors.append(
                    error(
                        f"COGWORKER['QUEUE_GROUPS'][{group!r}] lists {queue!r}, which is not a queue's name.",
                        GROUPS_HINT,
                        "cogworker.E036",
                    )
                )
            elif queue in seen:
                errors.append(
                    error(
                        f"COGWORKER['QUEUE_GROUPS'] lists the queue {queue!r} in {seen[queue]!r} "
                        f"and in {group!r}.",
                        "A queue's keys live in one slot: list it in one group.",
                        "cogworker.E036",
                    )
                )
            else:
                seen[queue] = group
    return errors
