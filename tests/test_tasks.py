"""Django's Tasks framework on cogworker (``django_cogworker.tasks``).

``django.tasks`` on Django >= 6.0, the ``django-tasks`` backport on 5.2 (the
dev extra installs it): these tests run on both, against a real Redis, with
tasks run by real ``manage.py cogworker`` processes.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import signal
import time
from datetime import timedelta
from typing import Any

import django
import pytest
from django.db import transaction
from django.utils import timezone

from django_cogworker import api, registry, testing
from django_cogworker.connection import get_keys
from django_cogworker.errors import ConfigurationError, JobTimeout
from django_cogworker.payload import encode
from django_cogworker.tasks import backend_configured, retry_options, runner, time_limits
from django_cogworker.tasks.backend import CogworkerBackend, CogworkerTask, TaskNotRegistered
from django_cogworker.tasks.compat import (
    FRAMEWORK,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from django_cogworker.tasks.options import PENDING_RESULT_TTL_S
from django_cogworker.tasks.timing import TIME_OPTIONS
from testproject.testapp import jobs, tasks
from tests.conftest import wait_for
from tests.test_worker_logs import LINE, bare_project
from tests.test_worker_logs import stop as stop_worker

try:
    from django.tasks import default_task_backend, task
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:
    from django_tasks import default_task_backend, task  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultMismatch  # type: ignore[no-redef]

BACKEND = "django_cogworker.tasks.CogworkerBackend"


@task
def defined_in_tests() -> None:
    """A task no worker knows: its module is never imported by the worker."""


def status_of(result_id: str) -> str:
    return str(default_task_backend.get_result(result_id).status)


def record_in_redis(cog: Any, result_id: str) -> dict[str, Any]:
    return json.loads(cog.redis.get(cog.key(f"result:{result_id}")))


def dead_entries(cog: Any) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in cog.redis.zrange(cog.key("dead"), 0, -1)]


def held_in_lists(cog: Any) -> dict[str, int]:
    """The queues and in-progress lists that hold something."""
    k = get_keys()
    lists = [
        key
        for prefix in (k.queue_prefix, k.inprogress_prefix)
        for key in cog.redis.scan_iter(match=f"{prefix}*")
    ]
    return {key.decode(): n for key in lists if (n := int(cog.redis.llen(key)))}


def use_tasks(settings: Any, **options: Any) -> None:
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": options}}


# -- the framework and the flags ------------------------------------------------


def test_backend_implements_the_installed_framework():
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == FRAMEWORK
    backend = task_backends["default"]
    assert isinstance(backend, CogworkerBackend)
    assert isinstance(tasks.add, CogworkerTask)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result) == (True,) * 3
    # No PRIORITY_QUEUES in the test project: priorities would be ignored, so
    # the flag says no (and a non-zero priority is refused below).
    assert backend.supports_priority is False
    assert backend_configured()


def test_tasks_are_registered_as_cogworker_jobs_when_their_module_is_imported():
    for func in (tasks.add, tasks.async_add, tasks.always_fails):
        job = registry.get(f"tasks:{func.module_path}")
        assert job is not None, func.module_path
    assert registry.get("tasks:testproject.testapp.tasks.helper") is None
    assert registry.get(f"tasks:{tasks.always_fails.module_path}").retry == 2


def test_tasks_modules_are_autodiscovered_only_with_this_backend(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    assert not backend_configured()
    settings.TASKS = {"other": {"BACKEND": BACKEND}}
    assert backend_configured()


# -- a task on a real worker ----------------------------------------------------


def test_enqueued_task_runs_on_a_worker_and_its_result_is_successful(cog):
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None and result.args == [2, 3] and result.backend == "default"
    payload = json.loads(cog.redis.lindex(cog.key("queue:default"), 0))
    assert (payload["jid"], payload["job"], payload["args"]) == (
        result.id,
        "tasks:testproject.testapp.tasks.add",
        [2, 3],
    )
    assert payload["retry"] is True  # the backend's RETRY default: COGWORKER['DEFAULT_RETRY']
    assert status_of(result.id) == "READY"

    cog.start_worker(env={"COGWORKER_TASKS_OPTIONS": json.dumps({"RESULT_TTL": 600})})
    wait_for(lambda: status_of(result.id) == "SUCCESSFUL", 20, "the task to succeed")
    result.refresh()
    assert result.return_value == 5
    assert result.is_finished and result.errors == [] and result.attempts == 1
    assert result.started_at <= result.finished_at
    assert result.worker_ids[0].endswith(f":{cog.workers[0].pid}")
    assert tasks.add.get_result(result.id).return_value == 5
    runs = cog.notes()
    assert [(r["tag"], r["jid"], r["name"]) for r in runs] == [
        ("add", result.id, f"tasks:{tasks.add.module_path}")
    ]
    # Kept RESULT_TTL seconds once finished (while pending: much longer).
    assert 0 < cog.redis.ttl(cog.key(f"result:{result.id}")) <= 600


@pytest.mark.django_db
def test_arguments_and_return_values_go_through_json(cog):
    value = {"when": "2024-01-01", "items": (1, 2.5, None, True), "nested": {"k": ["v"]}}
    result = tasks.echo.enqueue(value)
    testing.drain()
    assert tasks.echo.get_result(result.id).return_value == {
        "when": "2024-01-01",
        "items": [1, 2.5, None, True],
        "nested": {"k": ["v"]},
    }


def test_async_task_runs_and_the_async_api_uses_redis_asyncio(cog):
    async def enqueue_and_read() -> tuple[str, str]:
        result = await tasks.async_add.aenqueue(20, 22)
        fetched = await tasks.async_add.aget_result(result.id)
        return result.id, str(fetched.status)

    result_id, status = asyncio.run(enqueue_and_read())
    assert status == "READY"
    assert cog.redis.llen(cog.key("queue:default")) == 1
    cog.start_worker()
    wait_for(lambda: status_of(result_id) == "SUCCESSFUL", 20, "the async task to succeed")

    async def read() -> Any:
        return await default_task_backend.aget_result(result_id)

    assert asyncio.run(read()).return_value == 42
    (run,) = cog.notes()
    assert (run["jid"], run["name"]) == (
        result_id,
        f"tasks:{tasks.async_add.module_path}",
    )  # current_job() too


def test_failure_is_retried_recorded_per_attempt_then_failed_in_dead(cog):
    result = tasks.always_fails.enqueue("kaput")
    cog.start_worker()
    wait_for(lambda: status_of(result.id) == "FAILED", 30, "the task to exhaust its retries")
    wait_for(lambda: dead_entries(cog), 10, "the dead entry")
    (dead,) = dead_entries(cog)
    assert (dead["jid"], dead["job"], dead["retry_count"]) == (
        result.id,
        f"tasks:{tasks.always_fails.module_path}",
        2,
    )
    assert dead["error_class"] == "ValueError" and dead["error_message"] == "kaput"
    assert api.DeadSet().find(result.id) is not None

    result.refresh()
    assert result.attempts == 3 and len(result.errors) == 3
    assert {e.exception_class_path for e in result.errors} == {"builtins.ValueError"}
    assert result.errors[0].exception_class is ValueError
    assert "kaput" in result.errors[-1].traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert len(cog.notes()) == 3
    signals = [(s["signal"], s["status"]) for s in cog.notes("signals") if s["id"] == result.id]
    assert signals.count(("task_started", "RUNNING")) == 3
    assert [s for s in signals if s[0] == "task_finished"] == [("task_finished", "FAILED")]


def test_ready_between_attempts_then_successful_on_the_retry(cog):
    result = tasks.fails_first_attempt.enqueue("twice")
    cog.start_worker()
    wait_for(lambda: api.RetrySet().find(result.id), 20, "the first attempt to fail into the retry set")
    between = default_task_backend.get_result(result.id)
    assert between.status == TaskResultStatus.READY and not between.is_finished
    assert between.attempts == 1 and len(between.errors) == 1
    assert between.errors[0].exception_class_path == "builtins.RuntimeError"

    # retry_in keeps it an hour in the retry set; retry it now, as the admin would.
    assert api.RetrySet().find(result.id).retry()
    wait_for(lambda: status_of(result.id) == "SUCCESSFUL", 20, "the second attempt")
    result.refresh()
    assert result.return_value == {"attempt": 2, "tag": "twice"}
    assert result.attempts == 2 and len(result.errors) == 1
    assert [r["attempt"] for r in cog.notes()] == [1, 2]


def test_g14_a_task_raising_systemexit_or_keyboardinterrupt_is_recorded_and_filed_once(cog):
    """A BaseException that is not an Exception is the task's failure, as in
    Django's own backends: its error is in the record, the record says where
    the job is (FAILED when filed in dead, READY while it waits in the retry
    set), the job is filed once, and the worker's thread goes on."""
    last = tasks.raises.using(retry=0)
    exits, interrupted = last.enqueue("SystemExit"), last.enqueue("KeyboardInterrupt")
    retried = tasks.raises.using(retry=1).enqueue("KeyboardInterrupt")
    after = tasks.record.enqueue("after")
    worker = cog.start_worker("-c", "1")
    wait_for(lambda: status_of(after.id) == "SUCCESSFUL", 20, "the task after them, on the same thread")
    wait_for(lambda: cog.redis.zcard(cog.key("dead")) == 2, 10, "the two last attempts in dead")
    wait_for(lambda: api.RetrySet().find(retried.id), 10, "the retried one in the retry set")
    for result, kind in ((exits, "SystemExit"), (interrupted, "KeyboardInterrupt")):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED, kind
        assert [e.exception_class_path for e in result.errors] == [f"builtins.{kind}"]
        assert result.errors[0].traceback.endswith(f"{kind}: {kind} raised by the task\n")
        assert result.finished_at is not None and result.attempts == 1
    retried.refresh()
    assert (retried.status, retried.attempts, retried.finished_at) == (TaskResultStatus.READY, 1, None)
    assert [e.exception_class_path for e in retried.errors] == ["builtins.KeyboardInterrupt"]
    assert {e["jid"]: e["error_class"] for e in dead_entries(cog)} == {
        exits.id: "SystemExit",
        interrupted.id: "KeyboardInterrupt",
    }
    # Nothing left in progress or queued, so nothing can be taken for a
    # stray and run again: each ran once.
    wait_for(lambda: not held_in_lists(cog), 10, "the in-progress lists to empty")
    tags = sorted(n["tag"] for n in cog.notes())
    assert tags == ["KeyboardInterrupt", "KeyboardInterrupt", "SystemExit", "after"]
    assert cog.redis.zcard(cog.key("dead")) == 2 and cog.redis.zcard(cog.key("retry")) == 1
    assert worker.alive()


def test_drain_files_a_task_raising_keyboardinterrupt_then_raises_it(cog):
    """drain() runs jobs in the calling (main) thread, where a
    KeyboardInterrupt stops the caller, as Ctrl-C should and as Django's
    ImmediateBackend lets it: the job is filed first, and its record is
    final, never left RUNNING."""
    last = tasks.raises.using(retry=0).enqueue("KeyboardInterrupt")
    with pytest.raises(KeyboardInterrupt):
        testing.drain()
    last.refresh()
    assert last.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in last.errors] == ["builtins.KeyboardInterrupt"]
    assert [e["jid"] for e in dead_entries(cog)] == [last.id]

    retried = tasks.raises.using(retry=1).enqueue("KeyboardInterrupt")
    with pytest.raises(KeyboardInterrupt):
        testing.drain()
    retried.refresh()
    assert (retried.status, retried.attempts) == (TaskResultStatus.READY, 1)
    assert api.RetrySet().find(retried.id) is not None
    assert cog.redis.llen(cog.key("queue:default")) == 0 and len(dead_entries(cog)) == 1

    exits = tasks.raises.using(retry=0).enqueue("SystemExit")
    assert testing.drain() == 1  # any other BaseException is the task's failure, as in a worker
    exits.refresh()
    assert exits.status == TaskResultStatus.FAILED and len(dead_entries(cog)) == 2

    with testing.inline() as inline, pytest.raises(KeyboardInterrupt):
        tasks.raises.using(retry=0).enqueue("KeyboardInterrupt")
    (outcome,) = inline.outcomes
    assert outcome.kind == "dead"
    assert default_task_backend.get_result(outcome.jid).status == TaskResultStatus.FAILED


def test_drain_runs_an_async_task_from_an_async_test(cog):
    """An async test's drain() runs in a thread that runs an event loop,
    where an async task cannot be awaited for a synchronous caller: it is
    run in a thread of its own, as a worker's are, with its job context."""

    async def enqueue_and_drain() -> str:
        result = await tasks.async_add.aenqueue(20, 22)
        assert testing.drain() == 1
        return result.id

    result_id = asyncio.run(enqueue_and_drain())
    done = default_task_backend.get_result(result_id)
    assert (done.status, done.return_value, done.errors) == (TaskResultStatus.SUCCESSFUL, 42, [])
    assert [n["jid"] for n in cog.notes()] == [result_id]  # current_job() inside it


def test_a_task_whose_worker_is_killed_runs_again_on_another(cog):
    result = tasks.slow_on_first_attempt.enqueue(60)
    first = cog.start_worker()
    wait_for(lambda: cog.notes("started"), 20, "the first attempt to start")
    assert status_of(result.id) == "RUNNING"
    first.signal(signal.SIGKILL)
    first.wait(10)
    second = cog.start_worker()
    wait_for(lambda: status_of(result.id) == "SUCCESSFUL", 30, "the orphaned task to run again")
    result.refresh()
    assert result.return_value == {"attempt": 2}
    assert [w.rsplit(":", 1)[1] for w in result.worker_ids] == [str(first.pid), str(second.pid)]
    assert result.errors == []  # a lost process is not an error of the task


def test_run_after_waits_in_the_schedule_set(cog):
    run_after = timezone.now() + timedelta(seconds=1.5)
    result = tasks.record.using(run_after=run_after).enqueue("later")
    assert result.task.run_after == run_after
    assert cog.redis.zcard(cog.key("schedule")) == 1 and cog.redis.llen(cog.key("queue:default")) == 0
    assert default_task_backend.get_result(result.id).task.run_after == run_after
    # The unfinished record outlives the wait and the widest retry gap.
    assert cog.redis.pttl(cog.key(f"result:{result.id}")) / 1000 > PENDING_RESULT_TTL_S + 1.0
    cog.start_worker()
    wait_for(lambda: status_of(result.id) == "SUCCESSFUL", 20, "the deferred task")
    (run,) = cog.notes()
    assert run["at"] >= run_after.timestamp()


def test_priority_goes_to_the_queue_of_its_band_fetched_first(cog, settings):
    bands = {"PRIORITY_QUEUES": {"default": {50: "urgent"}}}
    use_tasks(settings, **bands)
    assert default_task_backend.supports_priority is True
    for tag in ("low-1", "low-2"):
        tasks.record.enqueue(tag)
    high = tasks.record.using(priority=60).enqueue("high")
    tasks.record.using(priority=-5).enqueue("low-3")
    assert [json.loads(p)["jid"] for p in cog.redis.lrange(cog.key("queue:urgent"), 0, -1)] == [high.id]
    assert cog.redis.llen(cog.key("queue:default")) == 3
    assert default_task_backend.get_result(high.id).task.priority == 60

    cog.start_worker(
        "-c", "1", QUEUES=["urgent", "default"], env={"COGWORKER_TASKS_OPTIONS": json.dumps(bands)}
    )
    wait_for(lambda: len(cog.notes()) == 4, 20, "four tasks to run")
    assert [r["tag"] for r in cog.notes()] == ["high", "low-1", "low-2", "low-3"]
    assert cog.notes()[0]["queue"] == "urgent"


# -- refusals --------------------------------------------------------------------


def test_a_payload_naming_anything_but_a_registered_task_is_filed_in_dead(cog):
    k = cog.key
    pwned = cog.tmp / "pwned"
    unknown = defined_in_tests.enqueue()  # a real task, but its module is not the worker's
    for i, name in enumerate(["tasks:os.system", "tasks:testproject.testapp.tasks.helper"]):
        payload = {
            "jid": f"evil{i}",
            "job": name,
            "args": [f"touch {pwned}"],
            "kwargs": {},
            "queue": "default",
            "retry": 3,
            "created_at": time.time(),
            "enqueued_at": time.time(),
        }
        cog.redis.lpush(k("queue:default"), encode(payload))
    cog.start_worker()
    wait_for(lambda: len(dead_entries(cog)) == 3, 20, "three payloads filed in dead")
    by_jid = {entry["jid"]: entry for entry in dead_entries(cog)}
    assert set(by_jid) == {unknown.id, "evil0", "evil1"}
    for entry in by_jid.values():
        assert entry["error_class"] == "django_cogworker.errors.JobNotRegistered"
        assert "is not registered" in entry["error_message"]
        assert "in an installed app's tasks module" in entry["error_message"]
        assert "retry_count" not in entry  # filed at once, never run
    assert f"task {defined_in_tests.module_path!r} is not registered" in by_jid[unknown.id]["error_message"]
    assert cog.notes() == []  # helper() never ran
    assert not pwned.exists()


def test_invalid_tasks_and_arguments_are_refused_at_enqueue(cog):
    def local() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    with pytest.raises(InvalidTask, match="Queue 'mail' is not valid"):
        tasks.record.using(queue_name="mail")
    needs = "priority 10 on queue 'default' needs TASKS['default']['OPTIONS']['PRIORITY_QUEUES']['default']"
    with pytest.raises(InvalidTask, match=re.escape(needs)):
        tasks.record.using(priority=10)
    with pytest.raises(InvalidTask, match="retry must be"):
        tasks.record.using(retry=-1)
    with pytest.raises(
        TypeError, match=re.escape("argument 'tag' of job 'tasks:testproject.testapp.tasks.record'")
    ):
        tasks.record.enqueue(tag=object())
    # Our message, with the wording every Django backend gives (Django's own tests look for it).
    with pytest.raises(TypeError) as refused:
        tasks.echo.enqueue(timezone.now())
    assert "positional argument 0 of job 'tasks:testproject.testapp.tasks.echo'" in str(refused.value)
    assert "Unsupported type: <class 'datetime.datetime'>" in str(refused.value)
    assert list(cog.redis.scan_iter(match=cog.key("*"))) == []


def test_results_that_do_not_exist_or_belong_elsewhere(cog):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("no-such-id")
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(result.id)
    cog.redis.set(cog.key("result:garbage"), b"not json")
    with pytest.raises(TaskResultDoesNotExist, match="unreadable"):
        default_task_backend.get_result("garbage")
    record = record_in_redis(cog, result.id)
    record["task"] = "somewhere.else"
    cog.redis.set(cog.key("result:other"), json.dumps({**record, "id": "other"}))
    with pytest.raises(TaskNotRegistered, match=re.escape("'somewhere.else', which no module imported")):
        default_task_backend.get_result("other")


# -- options ----------------------------------------------------------------------


def test_backend_retry_options_and_per_task_override(cog, settings):
    use_tasks(settings, RETRY=4, RETRY_IN="testproject.testapp.tasks.retry_in_an_hour")
    tasks.record.enqueue("x")
    tasks.always_fails.enqueue()
    tasks.record.using(retry=0).enqueue("y")
    retries = [json.loads(p)["retry"] for p in reversed(cog.redis.lrange(cog.key("queue:default"), 0, -1))]
    assert retries == [4, 2, 0]
    # RETRY_IN: the task's own, else the backend's.
    assert registry.get(f"tasks:{tasks.record.module_path}").retry_in(1, ValueError()) == 3600.0
    assert registry.get(f"tasks:{tasks.always_fails.module_path}").retry_in(1, ValueError()) == 0.1
    use_tasks(settings)
    assert registry.get(f"tasks:{tasks.record.module_path}").retry_in(1, ValueError()) is None


@pytest.mark.django_db
def plain_function() -> None:
    """Made a task inside a test (module level, as Django requires)."""


def test_retry_options_belong_under_task_and_take_valid_values():
    with pytest.raises(TypeError, match="retry_options goes below @task"):
        retry_options(retry=1)(tasks.record)
    with pytest.raises(TypeError, match="retry must be True, False or a whole number >= 0, got -2"):
        retry_options(retry=-2)
    with pytest.raises(TypeError, match="retry_in must be a callable or its dotted path, got 5"):
        retry_options(retry_in=5)  # type: ignore[arg-type]


def test_task_decorator_retry_where_the_framework_passes_extra_options(cog):
    accepts = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values())
    # django.tasks 6.0 passes no extra options to task_class; 6.1 and the backport do.
    assert accepts is (django.VERSION[:2] != (6, 0))
    if not accepts:
        with pytest.raises(TypeError, match="retry"):
            task(retry=3)(plain_function)
        return
    made = task(retry=3, retry_in=tasks.retry_quickly)(plain_function)
    assert (made.retry, made.retry_in) == (3, tasks.retry_quickly)
    made.enqueue()
    assert json.loads(cog.redis.lindex(cog.key("queue:default"), 0))["retry"] == 3
    assert registry.get(f"tasks:{made.module_path}").retry_in(0, ValueError()) == 0.1


def queued_payloads(cog: Any) -> list[dict[str, Any]]:
    """The default queue's payloads, oldest first."""
    return [json.loads(p) for p in reversed(cog.redis.lrange(cog.key("queue:default"), 0, -1))]


def redis_now(cog: Any) -> float:
    seconds, micros = cog.redis.time()
    return seconds + micros / 1_000_000


def plain_function_timed() -> None:
    """Made a task with @task(timeout=...) inside a test."""


def test_time_options_are_validated_like_jobs_and_written_as_job_writes_them(cog):
    # What @job refuses (it takes an infinite timeout, not an infinite expires).
    refused = [(option, v) for option in TIME_OPTIONS for v in (0, -1, True, "5")]
    for option, bad in [*refused, ("expires", float("nan")), ("expires", float("inf"))]:
        with pytest.raises(InvalidTask, match=f"{option} must be a positive number of seconds or None"):
            tasks.record.using(**{option: bad})
        with pytest.raises(TypeError, match=f"time_limits: {option} must be a positive number"):
            time_limits(**{option: bad})
    with pytest.raises(
        InvalidTask, match=re.escape("hard_timeout (2s) must not be shorter than timeout (5s)")
    ):
        tasks.record.using(timeout=5, hard_timeout=2)
    with pytest.raises(TypeError, match="time_limits goes below @task"):
        time_limits(timeout=1)(tasks.record)
    assert list(cog.redis.scan_iter(match=cog.key("*"))) == []

    tasks.record.enqueue("plain")
    tasks.record.using(timeout=5, hard_timeout=10, expires=30).enqueue("timed")
    jobs.record.set(timeout=5, hard_timeout=10, expires_in=30).delay("timed")
    tasks.expiring.using(expires=60, timeout=2).enqueue("both")  # .using() over @time_limits
    plain, timed, as_job, both = queued_payloads(cog)
    assert not {"timeout", "hard_timeout", "expires_at"} & set(plain)
    assert (timed["timeout"], timed["hard_timeout"]) == (as_job["timeout"], as_job["hard_timeout"]) == (5, 10)
    assert abs(timed["expires_at"] - as_job["expires_at"]) < 1
    assert redis_now(cog) + 25 < timed["expires_at"] <= redis_now(cog) + 30.1
    assert both["timeout"] == 2 and both["expires_at"] > redis_now(cog) + 55
    # Counted from run_after, as expires counts from a job's delay_at() time.
    later = tasks.expiring.using(run_after=timezone.now() + timedelta(seconds=100)).enqueue("later")
    [(entry, at)] = cog.redis.zrange(cog.key("schedule"), 0, -1, withscores=True)
    assert json.loads(entry)["jid"] == later.id
    assert json.loads(entry)["expires_at"] == pytest.approx(at + 1, abs=0.2)


def test_aenqueue_writes_the_time_options_too(cog):
    async def enqueue() -> None:
        await tasks.expiring.using(timeout=4).aenqueue("async")
        await tasks.record.using(hard_timeout=9).aenqueue("async, no deadline")

    asyncio.run(enqueue())
    expiring, timed = queued_payloads(cog)
    assert expiring["timeout"] == 4 and redis_now(cog) < expiring["expires_at"] <= redis_now(cog) + 1.1
    assert timed["hard_timeout"] == 9 and "expires_at" not in timed


def test_task_decorator_time_options_where_the_framework_passes_extra_options(cog):
    accepts = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values())
    if not accepts:  # django.tasks 6.0: @time_limits below @task instead
        with pytest.raises(TypeError, match="timeout"):
            task(timeout=3)(plain_function_timed)
        return
    with pytest.raises(InvalidTask, match="timeout must be a positive number"):
        task(timeout=-3)(plain_function_timed)
    made = task(timeout=3, hard_timeout=4, expires=50)(plain_function_timed)
    made.enqueue()
    [payload] = queued_payloads(cog)
    assert (payload["timeout"], payload["hard_timeout"]) == (3, 4) and "expires_at" in payload


def test_expires_a_task_queued_past_its_deadline_is_not_run_and_is_counted(cog):
    late = tasks.expiring.enqueue("late")
    [payload] = queued_payloads(cog)
    wait_for(lambda: redis_now(cog) > payload["expires_at"] + 0.05, 30, "Redis's clock past the deadline")
    marker = tasks.record.enqueue("marker")
    cog.start_worker()
    wait_for(lambda: status_of(marker.id) == "SUCCESSFUL", 30, "the marker task to run")
    wait_for(lambda: cog.redis.get(cog.key("stat:expired")) == b"1", 10, "the expired count")
    assert [n["tag"] for n in cog.notes()] == ["marker"]
    by_job = cog.redis.hgetall(cog.key("stat:expired:jobs"))
    assert by_job == {f"tasks:{tasks.expiring.module_path}".encode(): b"1"}
    assert cog.redis.zcard(cog.key("dead")) == cog.redis.zcard(cog.key("retry")) == 0
    # The marker's record says SUCCESSFUL before its job returns; its ack
    # (and the dropped job's) rides its thread's next fetch, a moment later.
    wait_for(lambda: held_in_lists(cog) == {}, 10, "the acks")
    assert status_of(late.id) == "READY", "never run: Django has no status for that"


def test_timeout_a_busy_task_is_stopped_and_filed_with_jobtimeout(cog):
    result = tasks.busy_past_timeout.enqueue("spin")
    cog.start_worker()
    wait_for(lambda: status_of(result.id) == "FAILED", 20, "the task to time out")
    wait_for(lambda: dead_entries(cog), 10, "the dead entry")  # filed after the record says FAILED
    (dead,) = dead_entries(cog)
    assert (dead["jid"], dead["error_class"]) == (result.id, "django_cogworker.errors.JobTimeout")
    assert "timeout of 1s" in dead["error_message"]
    result.refresh()
    assert [e.exception_class_path for e in result.errors] == ["django_cogworker.errors.JobTimeout"]
    [remaining] = cog.notes("remaining")  # current_job().remaining() counts down to it
    assert remaining["tag"] == "spin" and 0 < remaining["later"] < remaining["first"] <= 1
    assert cog.notes("overran") == cog.notes("swallowed") == [], "it never got out of its loop"
    # The thread survived: the worker runs the next task.
    after = tasks.add.enqueue(1, 2)
    wait_for(lambda: status_of(after.id) == "SUCCESSFUL", 20, "the next task")


@pytest.mark.django_db
def test_timeout_landing_in_the_record_write_after_the_task_returned_does_not_fail_it(cog, monkeypatch):
    """The timeout is armed around the whole job, the runner's writes
    included: one that runs out as the task returns lands in them (here:
    made to, once). The run still succeeds, and is not retried (run twice)."""
    real, landed = runner._save_quietly, []

    def lands_once(*args: Any, **kwargs: Any) -> None:
        if not landed:
            landed.append(True)
            raise JobTimeout()
        real(*args, **kwargs)

    monkeypatch.setattr(runner, "_save_quietly", lands_once)
    result = tasks.add.using(timeout=30).enqueue(2, 5)
    assert testing.drain() == 1
    assert landed == [True]
    done = default_task_backend.get_result(result.id)
    assert (done.status, done.return_value, done.errors) == (TaskResultStatus.SUCCESSFUL, 7, [])
    assert cog.redis.zcard(cog.key("retry")) == cog.redis.zcard(cog.key("dead")) == 0
    assert [n["tag"] for n in cog.notes()] == ["add"]
    finished = [s["status"] for s in cog.notes("signals") if s["signal"] == "task_finished"]
    assert finished == ["SUCCESSFUL"]


def test_a_return_value_json_cannot_carry_fails_without_a_retry(cog):
    result = tasks.returns_an_object.enqueue()
    assert testing.drain() == 1
    failed = default_task_backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path == "builtins.TypeError"
    assert cog.redis.zcard(cog.key("retry")) == 0 and cog.redis.zcard(cog.key("dead")) == 0
    assert len(cog.notes()) == 1


@pytest.mark.django_db
def test_a_lost_result_record_is_rebuilt_by_the_run(cog):
    result = tasks.add.enqueue(2, 2)
    cog.redis.delete(cog.key(f"result:{result.id}"))  # as if it expired during a long retry wait
    assert testing.drain() == 1
    rebuilt = tasks.add.get_result(result.id)
    assert (rebuilt.status, rebuilt.return_value, rebuilt.args, rebuilt.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        4,
        [2, 2],
        1,
    )
    assert rebuilt.enqueued_at is None


@pytest.mark.django_db
def test_the_backends_own_log_lines_read_like_a_plain_jobs(cog, worker_log):
    """Each line the backend writes in a worker opens as a plain job's does:
    ``jid=<jid> <job name> ``, the job name being ``tasks:<module path>``."""
    returns = tasks.returns_an_object.enqueue()
    lost, unreadable = tasks.add.enqueue(1, 2), tasks.add.enqueue(3, 4)
    cog.redis.delete(cog.key(f"result:{lost.id}"))
    cog.redis.set(cog.key(f"result:{unreadable.id}"), b"not json")
    fails = tasks.always_fails.using(retry=0).enqueue("out loud")
    worker_log.clear()
    assert testing.drain() == 4
    lines = [r.getMessage() for r in worker_log.records if r.name == "django_cogworker"]
    names = {
        r.id: f"tasks:{t.module_path}"
        for r, t in (
            (returns, tasks.returns_an_object),
            (lost, tasks.add),
            (unreadable, tasks.add),
            (fails, tasks.always_fails),
        )
    }
    for line in lines:
        jid = line.removeprefix("jid=").split(" ", 1)[0]
        assert jid in names and line.startswith(f"jid={jid} {names[jid]} "), line
    said = "\n".join(lines)
    object_name = names[returns.id]
    assert f"jid={returns.id} {object_name} failed (TypeError: Unsupported type" in said
    assert f"jid={lost.id} tasks:testproject.testapp.tasks.add has no result record; rebuilt" in said
    assert f"jid={unreadable.id} tasks:testproject.testapp.tasks.add has an unreadable result record" in said
    assert (
        f"jid={fails.id} tasks:testproject.testapp.tasks.always_fails failed (ValueError: out loud)" in said
    )


def test_the_frameworks_task_lines_print_as_the_workers_own(cog, tmp_path):
    """In a project without LOGGING, the Tasks framework's own lines (its
    signal receivers': a line per state of a task) come out of the worker in
    the worker's format, never as a bare line and a traceback from Python's
    last resort; one step quieter than the worker's lines, which already say
    when a task finished or failed: failures at -v 1, every state at -v 2."""
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.always_fails.using(retry=0).enqueue("kaput")
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    wait_for(lambda: f"Task id={bad.id} " in worker.log(), 20, "the framework's line of the failure")
    wait_for(lambda: f"jid={ok.id} " in worker.log(), 20, "the task's done line")
    log = stop_worker(worker)
    lines = log.splitlines()
    (failed,) = [line for line in lines if "Task id=" in line]
    assert LINE.match(failed), log
    assert failed.endswith(
        f"ERROR [{worker.pid}] Task id={bad.id} path={tasks.always_fails.module_path} state=FAILED"
    )
    assert f"jid={ok.id} tasks:{tasks.add.module_path} done in " in log

    loud = tasks.add.enqueue(3, 4)
    worker = cog.start_worker("-v", "2", env=bare_project(cog, tmp_path))
    wait_for(lambda: f"jid={loud.id} " in worker.log(), 20, "the task's done line")
    wait_for(lambda: "state=SUCCESSFUL" in worker.log(), 10, "the framework's line of the success")
    said = [line for line in stop_worker(worker).splitlines() if "Task id=" in line]
    assert [line.split("] ", 1)[1] for line in said] == [
        f"Task id={loud.id} path={tasks.add.module_path} state={state}" for state in ("RUNNING", "SUCCESSFUL")
    ]
    assert all(LINE.match(line) and " INFO " in line for line in said), said


@pytest.mark.django_db
def test_inline_mode_runs_the_task_at_once(cog):
    with testing.inline() as inline:
        result = tasks.add.enqueue(4, 5)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 9
    assert [o.kind for o in inline.outcomes] == ["ack"]


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_is_off_by_default_and_waits_for_commit_when_on(cog, settings):
    queue = cog.key("queue:default")
    with transaction.atomic():
        early = tasks.record.enqueue("early")
        assert cog.redis.llen(queue) == 1  # pushed at once, as Django does
    use_tasks(settings, ENQUEUE_ON_COMMIT=True)
    with transaction.atomic():
        committed = tasks.record.enqueue("committed")
        assert cog.redis.llen(queue) == 1
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(committed.id)
    assert cog.redis.llen(queue) == 2
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.record.enqueue("rolled back")
        raise RuntimeError("roll back")
    assert cog.redis.llen(queue) == 2
    assert not cog.redis.exists(cog.key(f"result:{rolled_back.id}"))
    assert {status_of(early.id), status_of(committed.id)} == {"READY"}


def test_signals_fire_in_the_enqueuing_process_and_in_the_worker(cog):
    result = tasks.add.enqueue(1, 2)
    cog.start_worker()
    wait_for(lambda: len([s for s in cog.notes("signals") if s["id"] == result.id]) == 3, 20, "three signals")
    signals = [(s["signal"], s["status"], s["pid"]) for s in cog.notes("signals") if s["id"] == result.id]
    worker_pid = cog.workers[0].pid
    assert signals == [
        ("task_enqueued", "READY", os.getpid()),
        ("task_started", "RUNNING", worker_pid),
        ("task_finished", "SUCCESSFUL", worker_pid),
    ]


# -- checks ----------------------------------------------------------------------


def test_check_reports_each_bad_option_clearly(cog):
    backend = CogworkerBackend(
        "bad",
        {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "mail"],
            "OPTIONS": {
                "RETRYS": 3,
                "RETRY": -1,
                "RETRY_IN": "no.such.module.backoff",
                "RESULT_TTL": 0,
                "ENQUEUE_ON_COMMIT": "yes",
                "PRIORITY_QUEUES": {"default": {500: "urgent", "ten": "x", 5: ""}, "other": {1: "q"}},
            },
        },
    )
    found = [(m.id, m.msg) for m in backend.check()]
    opt = "TASKS['bad']['OPTIONS']"
    bands = f"{opt}['PRIORITY_QUEUES']"
    assert found == [
        ("cogworker.tasks.E001", f"{opt}['RETRYS'] is not a known option; did you mean 'RETRY'?"),
        ("cogworker.tasks.E003", f"{opt}['RETRY'] must be True, False or a whole number >= 0, got -1."),
        ("cogworker.tasks.E005", f"{opt}['RESULT_TTL'] must be a positive number of seconds, got 0."),
        ("cogworker.tasks.E006", f"{opt}['ENQUEUE_ON_COMMIT'] must be True or False, got 'yes'."),
        ("cogworker.tasks.E007", f"{bands}['default']: 500 is not a whole number from -100 to 100."),
        ("cogworker.tasks.E007", f"{bands}['default']: 'ten' is not a whole number from -100 to 100."),
        ("cogworker.tasks.E007", f"{bands}['default'][5]: '' is not a cogworker queue name."),
        (
            "cogworker.tasks.E007",
            f"{bands}['other']: 'other' is not one of TASKS['bad']['QUEUES'] (default, mail).",
        ),
        (
            "cogworker.tasks.E004",
            f"{opt}['RETRY_IN']: cannot use RETRY_IN 'no.such.module.backoff': No module named 'no'.",
        ),
        (
            "cogworker.tasks.W001",
            "TASKS['bad']: tasks may be pushed to cogworker queue(s) mail, which COGWORKER['QUEUES'] "
            "does not list.",
        ),
    ]
    with pytest.raises(ConfigurationError, match="RETRYS"):
        backend.enqueue(tasks.add, (1, 2), {})
    good = CogworkerBackend("good", {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {}})
    assert good.check() == []
