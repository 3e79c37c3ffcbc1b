"""Other projects' Tasks test suites, run against ``CogworkerBackend``.

Each test gets the ``cog`` fixture (a namespace of its own on the test
Redis), so the suites' ``unittest`` classes run against a real Redis. The
suites' worker call is :func:`run_worker`: ``testing.drain()``, which pops
each job from its queue in Redis and runs it in this process with the
worker's own execution, retry and dead filing. See ``NOTICE``.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_cogworker import testing

BACKEND = "django_cogworker.tasks.CogworkerBackend"

#: Django's backends run a task once: no retries, as in the suites.
OPTIONS: dict[str, Any] = {"RETRY": 0}


@pytest.fixture(autouse=True)
def _cogworker_namespace(cog: Any) -> Any:
    return cog


def run_worker(*queues: str) -> int:
    """The suites' worker call: every queued job, run to its outcome."""
    return testing.drain(list(queues) or None)
