"""The backend's ``QUEUES`` and ``OPTIONS``: parsed once, checked with clear errors.

A problem found here is a system check error (ids ``cogworker.tasks.E0xx``)
and makes ``enqueue()`` raise ``ConfigurationError``; creating the backend
never raises, because Django creates it while a ``tasks`` module is being
imported (``@task`` validates the task against its backend), and an import
error there would hide the check's message.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.utils.module_loading import import_string

from django_cogworker.checks.base import is_number, unknown_names
from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.job import RetryIn, is_retry

F = TypeVar("F", bound=Callable[..., Any])

#: How long a finished task's result is kept, unless ``RESULT_TTL`` says.
#: A day: long enough to look at it after a night, short enough that a busy
#: site's results do not pile up in Redis.
DEFAULT_RESULT_TTL_S = 24 * 3600

#: How long an unfinished task's result is kept after each write (counted
#: from ``run_after`` for a deferred task). Longer than the widest gap between
#: two attempts of the default backoff (24**4 s, about 3.8 days, at the 25th
#: retry) so that a record outlives its task; a record that expired anyway is
#: rebuilt by the worker that runs the task.
PENDING_RESULT_TTL_S = 30 * 24 * 3600

#: Django's priority bounds (``TASK_MIN_PRIORITY``/``TASK_MAX_PRIORITY``).
PRIORITY_MIN = -100
PRIORITY_MAX = 100

KNOWN = ("RETRY", "RETRY_IN", "RESULT_TTL", "ENQUEUE_ON_COMMIT", "PRIORITY_QUEUES")


@dataclass(frozen=True)
class Problem:
    message: str
    hint: str
    id: str


@dataclass(frozen=True)
class TaskOptions:
    retry: bool | int = True
    retry_in: RetryIn | str | None = None
    result_ttl_s: float = DEFAULT_RESULT_TTL_S
    enqueue_on_commit: bool = False
    #: Django queue name -> bands ``(minimum priority, cogworker queue)``,
    #: highest minimum first.
    priority_queues: Mapping[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)

    def cogworker_queue(self, queue_name: str, priority: int) -> str:
        """The cogworker queue of a task: the band with the greatest minimum
        not above its priority; with none, the queue named like ``queue_name``."""
        for minimum, queue in self.priority_queues.get(queue_name, ()):
            if priority >= minimum:
                return queue
        return queue_name

    def all_queues(self, queue_names: set[str]) -> set[str]:
        """Every cogworker queue a task of these Django queues may go to."""
        found = set(queue_names)
        for bands in self.priority_queues.values():
            found.update(queue for _minimum, queue in bands)
        return found


#: Function attributes set by :func:`retry_options`.
RETRY_ATTR = "cogworker_retry"
RETRY_IN_ATTR = "cogworker_retry_in"


def is_retry_in(value: Any) -> bool:
    return value is None or callable(value) or (isinstance(value, str) and bool(value))


def retry_options(
    *, retry: bool | int | None = None, retry_in: RetryIn | str | None = None
) -> Callable[[F], F]:
    """Per-task retries, under ``@task`` (on every Django version)::

        @task
        @retry_options(retry=5, retry_in="shop.backoff.linear")
        def charge(order_id): ...

    ``retry``: True (``COGWORKER['DEFAULT_RETRY']``), False or 0 (none), or N
    retries after the first run; ``retry_in``: ``(count, exc) -> seconds``
    or its dotted path. None keeps the backend's ``OPTIONS``."""
    if retry is not None and not is_retry(retry):
        raise TypeError(f"retry_options: retry must be True, False or a whole number >= 0, got {retry!r}")
    if not is_retry_in(retry_in):
        raise TypeError(f"retry_options: retry_in must be a callable or its dotted path, got {retry_in!r}")

    def apply(func: F) -> F:
        if not inspect.isfunction(func):
            # Above @task it would get the (frozen) Task, not the function.
            raise TypeError(f"retry_options goes below @task, on the function itself, not on {func!r}")
        setattr(func, RETRY_ATTR, retry)
        setattr(func, RETRY_IN_ATTR, retry_in)
        return func

    return apply


def task_retry(task: Any) -> bool | int | None:
    """A task's own retry: ``.using(retry=...)``/``@task(retry=...)``, else
    ``@retry_options``; None when it has none (the backend's applies)."""
    value = getattr(task, "retry", None)
    return value if value is not None else getattr(task.func, RETRY_ATTR, None)


def task_retry_in(task: Any) -> RetryIn | str | None:
    value = getattr(task, "retry_in", None)
    return value if value is not None else getattr(task.func, RETRY_IN_ATTR, None)


def parse(alias: str, params: Any) -> tuple[TaskOptions, list[Problem]]:
    """The options of ``TASKS[alias]``, and every problem with them."""
    where = f"TASKS[{alias!r}]"
    problems: list[Problem] = []
    if not isinstance(params, dict):
        return TaskOptions(), [
            Problem(f"{where} must be a dict.", "See docs/django-tasks.md.", "cogworker.tasks.E001")
        ]
    queues = params.get("QUEUES", [DEFAULT_QUEUE])
    queue_names: set[str] = set()
    if not isinstance(queues, list | tuple | set) or not all(isinstance(q, str) and q for q in queues):
        problems.append(
            Problem(
                f"{where}['QUEUES'] must be a list of non-empty queue names, got {queues!r}.",
                "For example ['default', 'mail'] (an empty list allows any name).",
                "cogworker.tasks.E002",
            )
        )
    else:
        queue_names = set(queues)
    raw = params.get("OPTIONS", {})
    if not isinstance(raw, dict):
        problems.append(
            Problem(
                f"{where}['OPTIONS'] must be a dict, got {type(raw).__name__}.",
                f"Known options: {', '.join(KNOWN)}.",
                "cogworker.tasks.E001",
            )
        )
        return TaskOptions(), problems
    for key, ending in unknown_names(raw, KNOWN):
        problems.append(
            Problem(
                f"{where}['OPTIONS'][{key!r}] is not a known option{ending}",
                f"Known options: {', '.join(KNOWN)}.",
                "cogworker.tasks.E001",
            )
        )
    options = TaskOptions()
    retry = raw.get("RETRY", options.retry)
    if not is_retry(retry):
        problems.append(
            Problem(
                f"{where}['OPTIONS']['RETRY'] must be True, False or a whole number >= 0, got {retry!r}.",
                "True retries up to COGWORKER['DEFAULT_RETRY'] times; N retries N times (N+1 runs).",
                "cogworker.tasks.E003",
            )
        )
        retry = options.retry
    retry_in = raw.get("RETRY_IN")
    if not is_retry_in(retry_in):
        problems.append(
            Problem(
                f"{where}['OPTIONS']['RETRY_IN'] must be None or the dotted path of a callable "
                f"(count, exc) -> seconds, got {retry_in!r}.",
                "None keeps cogworker's backoff (count**4 + 15 s, with jitter).",
                "cogworker.tasks.E004",
            )
        )
        retry_in = None
    ttl = raw.get("RESULT_TTL", options.result_ttl_s)
    if not is_number(ttl) or not ttl > 0:
        problems.append(
            Problem(
                f"{where}['OPTIONS']['RESULT_TTL'] must be a positive number of seconds, got {ttl!r}.",
                f"The default keeps a finished task's result {DEFAULT_RESULT_TTL_S} s.",
                "cogworker.tasks.E005",
            )
        )
        ttl = options.result_ttl_s
    on_commit = raw.get("ENQUEUE_ON_COMMIT", options.enqueue_on_commit)
    if not isinstance(on_commit, bool):
        problems.append(
            Problem(
                f"{where}['OPTIONS']['ENQUEUE_ON_COMMIT'] must be True or False, got {on_commit!r}.",
                "False (the default, as in Django) pushes at once; True waits for the transaction to commit.",
                "cogworker.tasks.E006",
            )
        )
        on_commit = False
    bands = _priority_queues(where, raw.get("PRIORITY_QUEUES", {}), queue_names, problems)
    return (
        TaskOptions(
            retry=retry,
            retry_in=retry_in,
            result_ttl_s=float(ttl),
            enqueue_on_commit=on_commit,
            priority_queues=bands,
        ),
        problems,
    )


def _priority_queues(
    where: str, raw: Any, queue_names: set[str], problems: list[Problem]
) -> dict[str, tuple[tuple[int, str], ...]]:
    hint = (
        "Map a Django queue name to {minimum priority: cogworker queue}, e.g. "
        "{'default': {50: 'urgent', 0: 'default', -100: 'bulk'}}, and list those queues in "
        "COGWORKER['QUEUES'] in the order to fetch them."
    )
    bad = f"{where}['OPTIONS']['PRIORITY_QUEUES']"
    if not isinstance(raw, dict):
        problems.append(
            Problem(f"{bad} must be a dict, got {type(raw).__name__}.", hint, "cogworker.tasks.E007")
        )
        return {}
    result: dict[str, tuple[tuple[int, str], ...]] = {}
    for queue_name, mapping in raw.items():
        if queue_names and queue_name not in queue_names:
            problems.append(
                Problem(
                    f"{bad}[{queue_name!r}]: {queue_name!r} is not one of {where}['QUEUES'] "
                    f"({', '.join(sorted(queue_names))}).",
                    hint,
                    "cogworker.tasks.E007",
                )
            )
            continue
        if not isinstance(mapping, dict) or not mapping:
            problems.append(
                Problem(
                    f"{bad}[{queue_name!r}] must be a non-empty dict, got {mapping!r}.",
                    hint,
                    "cogworker.tasks.E007",
                )
            )
            continue
        bands: list[tuple[int, str]] = []
        for key, queue in mapping.items():
            minimum = _whole_number(key)
            if minimum is None or not PRIORITY_MIN <= minimum <= PRIORITY_MAX:
                problems.append(
                    Problem(
                        f"{bad}[{queue_name!r}]: {key!r} is not a whole number from {PRIORITY_MIN} "
                        f"to {PRIORITY_MAX}.",
                        hint,
                        "cogworker.tasks.E007",
                    )
                )
            elif not isinstance(queue, str) or not queue or "," in queue:
                problems.append(
                    Problem(
                        f"{bad}[{queue_name!r}][{minimum}]: {queue!r} is not a cogworker queue name.",
                        hint,
                        "cogworker.tasks.E007",
                    )
                )
            else:
                bands.append((minimum, queue))
        if bands:
            result[queue_name] = tuple(sorted(bands, reverse=True))
    return result


def _whole_number(key: Any) -> int | None:
    """An int key, or the text of one (settings read from JSON have string keys)."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, str):
        try:
            return int(key.strip())
        except ValueError:
            return None
    return None


def check_retry_in(where: str, value: RetryIn | str | None) -> list[Problem]:
    """Whether a dotted ``RETRY_IN`` imports (only checks import it)."""
    if not isinstance(value, str):
        return []
    try:
        resolve_retry_in(value)
    except (ImportError, TypeError) as exc:
        return [
            Problem(
                f"{where}: cannot use RETRY_IN {value!r}: {exc}.",
                "Give the dotted path of a callable (count, exc) -> seconds or None.",
                "cogworker.tasks.E004",
            )
        ]
    return []


@functools.lru_cache(maxsize=128)
def _import_callable(path: str) -> RetryIn:
    found = import_string(path)
    if not callable(found):
        raise TypeError(f"{path} is a {type(found).__name__}, not a callable")
    return found


def resolve_retry_in(value: RetryIn | str | None) -> RetryIn | None:
    """A callable from settings or code (a dotted path is imported once; never
    a name found in a payload)."""
    if value is None or callable(value):
        return value
    return _import_callable(value)
