"""``CogworkerBackend``: Django's Tasks API on cogworker (its ``task_class``,
``CogworkerTask``, is in ``task.py``).

Duties: validate a task, cogworker's options included, and register it with
the worker registry (Django validates every ``Task`` as it is made, so
importing a module of ``@task`` functions registers them); enqueue a task
as a cogworker payload plus its result record in one MULTI (``run_after`` to
the schedule set, priority to a queue of ``PRIORITY_QUEUES``, the time
options written as ``@job`` writes them), after commit when
``ENQUEUE_ON_COMMIT`` asks, through the client's write path
(:func:`django_cogworker.client.push`: the same queue registration and
errors as ``.delay()``); read results back (``redis.asyncio`` for the async
twins); report bad settings as system checks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core.checks import CheckMessage, Error, Warning

from django_cogworker import client, middleware, registry
from django_cogworker.conf import get_config
from django_cogworker.connection import async_redis, get_keys, get_redis
from django_cogworker.errors import CogworkerError, ConfigurationError
from django_cogworker.job import is_retry
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload
from django_cogworker.shards import known_groups
from django_cogworker.tasks import runner
from django_cogworker.tasks.compat import (
    DEFAULT_TASK_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_backends,
    task_enqueued,
)
from django_cogworker.tasks.names import job_name
from django_cogworker.tasks.options import (
    Problem,
    TaskOptions,
    check_retry_in,
    is_retry_in,
    parse,
    task_retry,
    task_retry_in,
)
from django_cogworker.tasks.records import Record, dumps, epoch_s, loads, new_record, pending_ttl_s, to_result
from django_cogworker.tasks.task import CogworkerTask
from django_cogworker.tasks.timing import task_time_limits, time_limits_problem

__all__ = ["CogworkerBackend", "CogworkerTask", "TaskNotRegistered", "TaskRefused"]


class TaskNotRegistered(CogworkerError):
    """A result names a task that no module imported in this process defines."""


class TaskRefused(CogworkerError):
    """A client middleware refused the task's payload: nothing was enqueued."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    payload: Payload
    record: Record
    at: float | None  # schedule score, or None to push now
    result: TaskResult
    pending_ttl_s: float
    chain: middleware.ClientChain


class CogworkerBackend(BaseTaskBackend):
    task_class = CogworkerTask

    supports_defer = True
    """``run_after``: the payload waits in the schedule set (``N:schedule``)
    until the poller moves it to its queue."""

    supports_async_task = True
    """``async def`` tasks are awaited on the worker's event loop, up to
    ``ASYNC_CONCURRENCY`` at once beside its threads (SPEC section 15;
    ``tasks/runner.py:arun``)."""

    supports_get_result = True
    """Results live in Redis, readable from any process, kept ``RESULT_TTL``
    seconds after the task finishes."""

    supports_priority = False
    """True on a backend whose ``OPTIONS['PRIORITY_QUEUES']`` maps priorities
    to cogworker queues, fetched in order by the workers; without that map a
    priority other than 0 is refused rather than silently ignored."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.task_options, self.problems = parse(alias, params)
        self.supports_priority = bool(self.task_options.priority_queues)

    # -- validation and registration -------------------------------------------

    def validate_task(self, task: Task) -> None:
        bands = self.task_options.priority_queues
        if task.priority != DEFAULT_TASK_PRIORITY and task.queue_name not in bands:
            raise InvalidTask(
                f"Task {task.module_path}: priority {task.priority} on queue {task.queue_name!r} needs "
                f"TASKS[{self.alias!r}]['OPTIONS']['PRIORITY_QUEUES'][{task.queue_name!r}] = "
                "{minimum priority: cogworker queue} (see docs/django-tasks.md)."
            )
        super().validate_task(task)
        retry = task_retry(task)
        if retry is not None and not is_retry(retry):
            raise InvalidTask(f"Task {task.module_path}: retry must be True, False or a whole number >= 0.")
        if not is_retry_in(task_retry_in(task)):
            raise InvalidTask(f"Task {task.module_path}: retry_in must be a callable or its dotted path.")
        problem = time_limits_problem(task_time_limits(task))
        if problem:
            raise InvalidTask(f"Task {task.module_path}: {problem}.")
        runner.register(task, find_owner)

    # -- enqueue -----------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        prepared = self._prepare(task, args, kwargs)
        # testing.inline() runs it now, in this thread; the record still
        # lives in Redis, where the task's run writes its outcome.
        inline = client.deliver(
            prepared.chain,
            [prepared.payload],
            prepared.at,
            on_commit=self.task_options.enqueue_on_commit,
            also=self._record_write(prepared),
            then=lambda: self._announce(prepared),
        )
        return self.get_result(prepared.result.id) if inline else prepared.result

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        options = self.task_options
        if (
            options.enqueue_on_commit
            or client.inline_mode()
            or get_config().cache_alias
            or task_time_limits(task)["expires"] is not None
        ):
            # Transactions and django-redis are synchronous, and so is the
            # TIME that an expiring task's deadline may ask.
            return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)
        prepared = self._prepare(task, args, kwargs)
        await client.apush(prepared.chain, [prepared.payload], prepared.at, also=self._record_write(prepared))
        await task_enqueued.asend_robust(sender=type(self), task_result=prepared.result)
        return prepared.result

    def _prepare(self, task: Task, args: Any, kwargs: Any) -> Prepared:
        if self.problems:
            problem = self.problems[0]
            raise ConfigurationError(f"{problem.message} {problem.hint} (manage.py check lists them all)")
        self.validate_task(task)
        job = registry.get(job_name(task.module_path))
        if job is None:  # validate_task() registers it; only a cleared registry gets here
            raise CogworkerError(f"task {task.module_path} is not registered in this process")
        options = self.task_options
        retry = task_retry(task)
        queue = options.cogworker_queue(task.queue_name, task.priority)
        now = time.time()
        run_after_s = epoch_s(task.run_after) if task.run_after is not None else None
        at = run_after_s if run_after_s is not None and run_after_s > now else None
        # Time options as @job(...) writes them: the worker honours them alike.
        limits = task_time_limits(task)
        job = job.set(queue=queue, retry=options.retry if retry is None else retry, **limits)
        try:
            payload = job.payload(list(args), dict(kwargs), now)
        except TypeError as exc:  # an argument JSON cannot carry; nothing pushed
            raise TypeError(_with_framework_wording(exc, args, kwargs)) from None
        if job.expires is not None:
            # Due at run_after (also one already past, as delay_at()'s), else now.
            job.expiring(payload, run_after_s)
        # The client middleware sees task payloads as it sees .delay()'s.
        chain = middleware.client_chain()
        ready = chain.run(payload, at=at)
        if ready is None:
            raise TaskRefused(f"a client middleware refused task {task.module_path}; nothing was enqueued")
        record = new_record(
            result_id=str(ready["jid"]),
            module_path=task.module_path,
            alias=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            run_after_s=run_after_s,
            args=ready["args"],
            kwargs=ready["kwargs"],
            queue=str(ready["queue"]),
            now=now,
        )
        return Prepared(
            payload=ready,
            record=record,
            at=at,
            result=to_result(record, task),
            pending_ttl_s=pending_ttl_s(record, options.result_ttl_s, now),
            chain=chain,
        )

    def _key(self, prepared: Prepared) -> str:
        return get_keys().for_payload(prepared.payload).result(prepared.result.id)

    def _record_write(self, prepared: Prepared) -> client.Also:
        """The record's SET, queued before the payload in the push's MULTI: a
        result without its job (or a job without its result) is never seen."""
        key, raw, px = self._key(prepared), dumps(prepared.record), _ms(prepared.pending_ttl_s)
        return lambda pipe: pipe.set(key, raw, px=px)

    def _announce(self, prepared: Prepared) -> None:
        # send_robust: the task is in Redis now; a failing receiver must not
        # make the caller believe it is not (and enqueue it twice).
        task_enqueued.send_robust(sender=type(self), task_result=prepared.result)

    # -- results -------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        if not isinstance(result_id, str) or not result_id:
            raise TaskResultDoesNotExist(result_id)
        return self._result(result_id, _stored(get_redis(), get_keys(), result_id))

    async def aget_result(self, result_id: str) -> TaskResult:
        if not isinstance(result_id, str) or not result_id:
            raise TaskResultDoesNotExist(result_id)
        if get_config().cache_alias or get_keys().sharded:
            # django-redis is synchronous; so is the look over the groups.
            return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)
        async with async_redis() as conn:
            raw = await conn.get(get_keys().result(result_id))
        return self._result(result_id, raw)

    def _result(self, result_id: str, raw: bytes | str | None) -> TaskResult:
        if raw is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            record = loads(raw)
        except ValueError as exc:
            raise TaskResultDoesNotExist(f"{result_id}: the record in Redis is unreadable ({exc})") from None
        task = runner.lookup(record["task"])
        if task is None:
            raise TaskNotRegistered(
                f"result {result_id} belongs to task {record['task']!r}, which no module imported in this "
                "process defines; define it with @task in an installed app's tasks module"
            )
        return to_result(record, task)

    # -- checks ----------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        where = f"TASKS[{self.alias!r}]"
        problems: list[Problem] = [*self.problems]
        problems += check_retry_in(f"{where}['OPTIONS']['RETRY_IN']", self.task_options.retry_in)
        messages: list[CheckMessage] = [Error(p.message, hint=p.hint, obj=where, id=p.id) for p in problems]
        if not apps.is_installed("django_cogworker"):
            messages.append(
                Error(
                    f"{where} uses CogworkerBackend but 'django_cogworker' is not in INSTALLED_APPS.",
                    hint="Add 'django_cogworker' to INSTALLED_APPS: it registers tasks and runs workers.",
                    obj=where,
                    id="cogworker.tasks.E008",
                )
            )
        messages += self._queue_warnings(where)
        return messages

    def _queue_warnings(self, where: str) -> Iterable[CheckMessage]:
        if not self.queues:
            return []
        try:
            fetched = {q.name for q in get_config().queues}
        except Exception:
            return []  # COGWORKER's own checks report a broken QUEUES
        missing = sorted(self.task_options.all_queues(self.queues) - fetched)
        if not missing:
            return []
        return [
            Warning(
                f"{where}: tasks may be pushed to cogworker queue(s) {', '.join(missing)}, which "
                "COGWORKER['QUEUES'] does not list.",
                hint="A worker started without -q fetches only COGWORKER['QUEUES']: list them there "
                "(highest priority first) or start workers with -q for each.",
                obj=where,
                id="cogworker.tasks.W001",
            )
        ]


def find_owner(alias: str | None, task: Task | None) -> runner.Owner:
    """The cogworker backend a result belongs to, in this process's TASKS
    (the record's alias, else the task's): what the runner needs of it.
    Neither one a cogworker backend: the default options, and this class as
    the sender of the signals."""
    for name in (alias, task.backend if task is not None else None):
        if not name:
            continue
        try:
            found = task_backends[name]
        except Exception:
            continue
        if isinstance(found, CogworkerBackend):
            return runner.Owner(found.task_options, type(found))
    return runner.Owner(TaskOptions(), CogworkerBackend)


def _with_framework_wording(ours: TypeError, args: Any, kwargs: Any) -> str:
    """Our message, which names the argument, followed by the framework's
    own when it refuses the value too ("Unsupported type: <class ...>": what
    every Django backend raises as it builds the TaskResult, and what
    Django's tests look for)."""
    try:
        normalize_json([list(args), dict(kwargs)])
    except (TypeError, ValueError) as theirs:
        return f"{ours} ({theirs})"
    return str(ours)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _stored(client: Any, keys: Keys, result_id: str) -> Any:
    """A result's record as stored, or None. Under SHARDING it is in the
    group of its job's queue, which the id does not name: each group's key
    is read, in one pipeline (a round trip per master)."""
    if not keys.sharded:
        return client.get(keys.result(result_id))
    pipe = client.pipeline(transaction=False)
    for group in known_groups(client, keys):
        pipe.get(group.result(result_id))
    return next((raw for raw in pipe.execute() if raw is not None), None)
