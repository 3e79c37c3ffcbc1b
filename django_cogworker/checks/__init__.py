"""System checks for ``COGWORKER`` (ids ``cogworker.E001``...), run at startup.

Each error names the key and says what would be right. Here: the setting as
a whole (E001, E002); registered with Django by ``system_checks.py``, which
imports this package only when the checks run; by topic, each a function of
the merged values:

- :mod:`.numbers`: durations, counts and intervals (E003-E007);
- :mod:`.connection`: Redis, the embedded server, the namespace, confirmed enqueue
  (E008-E012, E021, E024-E027);
- :mod:`.queues`: ``QUEUES``, ``FETCH``, ``ENQUEUE_ON_COMMIT``, ``FAST_PATH``, ``CPU_AFFINITY`` (E013-E016,
  E028);
- :mod:`.paths`: ``MIDDLEWARE`` and ``ERROR_HANDLERS`` (E017-E019);
- :mod:`.periodic`: ``PERIODIC`` (E020, E022, E023);
- :mod:`.sharding`: ``SHARDING`` and ``QUEUE_GROUPS`` (E035, E036).

Apart, since it reads the registered jobs too: W001, a queue that jobs or
periodic entries push to but ``QUEUES`` does not list (:mod:`.queues`).
"""

from __future__ import annotations

# Kept on the package: tests hide the embedded extra through
# ``checks.importlib.util.find_spec``, as when the checks were one module.
import importlib.util  # noqa: F401
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage

from django_cogworker.checks.base import error, unknown_names
from django_cogworker.checks.connection import check_connection
from django_cogworker.checks.numbers import check_intervals, check_numbers
from django_cogworker.checks.paths import check_dotted_paths
from django_cogworker.checks.periodic import check_periodic
from django_cogworker.checks.queues import check_queues_and_modes
from django_cogworker.checks.sharding import check_sharding
from django_cogworker.conf import DEFAULTS, merged

#: The checks of the merged values, in the order their errors are listed.
CHECKS: list[Callable[[dict[str, Any]], list[CheckMessage]]] = [
    check_numbers,
    check_intervals,
    check_connection,
    check_queues_and_modes,
    check_dotted_paths,
    check_periodic,
    check_sharding,
]


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "COGWORKER", {})
    if not isinstance(raw, dict):
        return [
            error(
                f"COGWORKER must be a dict, not {type(raw).__name__}.",
                "Set COGWORKER = {...} with the keys of the settings reference.",
                "cogworker.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for key, ending in unknown_names(raw, DEFAULTS):
        errors.append(
            error(
                f"COGWORKER[{key!r}] is not a known setting{ending}",
                f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                "cogworker.E002",
            )
        )
    values = merged()
    for check in CHECKS:
        errors += check(values)
    return errors
