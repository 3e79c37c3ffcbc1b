# Vendored from django-tasks-db 0.13.0's tests/tests.py, its
# DatabaseBackendTestCase (BSD-3-Clause, see tests/peer_tasks/
# LICENSE.django-tasks-db and NOTICE), adapted to run against
# CogworkerBackend on the test Redis: every change is marked "cogworker:".
# Where the suite wrote a result row to stand for a worker's run, the worker
# call run_worker() (testing.drain()) runs the task. The tests of the
# database backend's own model (DBTaskResult: its indexes, constraints,
# migrations and id_function) are kept, marked xfail and not run. The file's
# other classes (the db_worker command, pruning, the admin) test that
# backend's own commands and are not vendored.
import contextlib
import copy
import json
import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast
from unittest import skipIf

import pytest
from django import VERSION
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import connection, transaction
from django.db.utils import IntegrityError
from django.test import TransactionTestCase, override_settings

from django_cogworker.connection import get_keys, get_redis
from django_cogworker.tasks.backend import CogworkerBackend, TaskNotRegistered
from django_cogworker.tasks.compat import task_enqueued
from tests.peer_tasks.conftest import BACKEND, OPTIONS, run_worker
from tests.peer_tasks.framework import (
    LOGGER,
    InvalidTask,
    Task,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
)

from ..django_tasks_rq import tasks as test_tasks  # cogworker: the suites share it

#: cogworker: the database backend's model, which only its own tests (not
#: run here) use.
DBTaskResult: Any = None

#: cogworker: a test of the database backend's own model, not of a backend.
DB_MODEL = pytest.mark.xfail(
    run=False, reason="tests django-tasks-db's own model (DBTaskResult), which a Redis backend has no part of"
)

#: cogworker: the ids are the jobs' jids (24 hex characters), not UUIDs of an id_function.
ID_FUNCTION = pytest.mark.xfail(
    run=False,
    reason="the database backend's OPTIONS['id_function']: a result's id here is its job's jid",
)


def record_naming(path):
    """cogworker: a result record in Redis naming ``path`` (the suite: a row)."""
    result_id = uuid.uuid4().hex[:24]
    record = {"id": result_id, "task": path, "status": "READY", "args": [], "kwargs": {}}
    get_redis().set(get_keys().result(result_id), json.dumps(record))
    return result_id


def queued_jids(queue):
    raw = get_redis().lrange(get_keys().queue(queue), 0, -1)
    return [json.loads(item)["jid"] for item in reversed(raw)]


@override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": OPTIONS}})
class DatabaseBackendTestCase(TransactionTestCase):
    @contextlib.contextmanager
    def _capture_task_enqueued_signal(
        self,
    ) -> Iterator[list[tuple[type[CogworkerBackend], Any]]]:
        received: list[tuple[type[CogworkerBackend], Any]] = []

        def capture_signal(sender: type[CogworkerBackend], task_result: Any, **kwargs: Any) -> None:
            received.append((sender, task_result))

        task_enqueued.connect(capture_signal, dispatch_uid="db_enqueue_signal", weak=False)
        try:
            yield received
        finally:
            task_enqueued.disconnect(capture_signal, dispatch_uid="db_enqueue_signal")

    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], CogworkerBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, OPTIONS)  # cogworker

    def test_enqueue_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task), self.assertNumQueries(0):  # cogworker: Redis
                with self._capture_task_enqueued_signal() as received:
                    result = cast(Task, task).enqueue(1, two=3)

                self.assertRegex(result.id, "^[0-9a-f]{24}$")  # cogworker: a jid
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertFalse(result.is_finished)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa:B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(received, [(CogworkerBackend, result)])

    async def test_enqueue_task_async(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                with self._capture_task_enqueued_signal() as received:
                    result = await cast(Task, task).aenqueue()

                self.assertRegex(result.id, "^[0-9a-f]{24}$")  # cogworker: a jid
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertFalse(result.is_finished)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa:B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(received, [(CogworkerBackend, result)])

    def test_get_result(self) -> None:
        with self.assertNumQueries(0):  # cogworker: Redis
            result = default_task_backend.enqueue(test_tasks.noop_task, [], {})

        with self.assertNumQueries(0):  # cogworker: Redis
            new_result = default_task_backend.get_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task, [], {})

        new_result = await default_task_backend.aget_result(result.id)

        self.assertEqual(result, new_result)

    def test_refresh_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})

        run_worker()  # cogworker: the worker call (the suite wrote the row)

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertFalse(result.is_finished)
        self.assertIsNone(result.started_at)
        self.assertIsNone(result.last_attempted_at)
        self.assertIsNone(result.finished_at)
        self.assertEqual(result.attempts, 0)

        with self.assertNumQueries(0):  # cogworker: Redis
            result.refresh()

        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(result.is_finished)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(result.attempts, 1)

    async def test_refresh_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, [], {})

        run_worker()  # cogworker: the worker call (the suite wrote the row)

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertFalse(result.is_finished)
        self.assertIsNone(result.started_at)
        self.assertIsNone(result.last_attempted_at)
        self.assertIsNone(result.finished_at)
        self.assertEqual(result.attempts, 0)

        await result.arefresh()

        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(result.is_finished)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(result.attempts, 1)

    def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(uuid.uuid4()))

    async def test_async_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result(str(uuid.uuid4()))

    def test_invalid_uuid(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result("123")

    async def test_async_invalid_uuid(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("123")

    @pytest.mark.xfail(  # cogworker
        raises=TaskNotRegistered,
        reason="a result naming a path that no imported module defines as a task raises TaskNotRegistered "
        "(a CogworkerError saying where to define it), not SuspiciousOperation; nothing is imported",
        strict=True,
    )
    def test_invalid_task_path(self) -> None:
        result_id = record_naming("subprocess.check_output")  # cogworker: a record

        with self.assertRaisesMessage(
            SuspiciousOperation,
            f"Task {result_id} does not point to a Task (subprocess.check_output)",
        ):
            default_task_backend.get_result(result_id)  # cogworker

    @pytest.mark.xfail(  # cogworker
        raises=TaskNotRegistered,
        reason="a path named in Redis is never imported: TaskNotRegistered, not the ImportError of an import",
        strict=True,
    )
    def test_missing_task_path(self) -> None:
        result_id = record_naming("missing.func")  # cogworker: a record

        with self.assertRaises(ImportError):
            default_task_backend.get_result(result_id)  # cogworker

    @DB_MODEL  # cogworker
    def test_task_name(self) -> None:
        for task_path, expected_task_name in [
            ("tests.tasks.noop_task", "noop_task"),
            ("tests.tasks.task_not_found", "task_not_found"),
            ("tests.tasks.module_not_found.module_not_found", "module_not_found"),
            ("unexpected_function", "unexpected_function"),
        ]:
            with self.subTest(task_path):
                db_task_result = DBTaskResult.objects.create(
                    args_kwargs={"args": [], "kwargs": {}},
                    task_path=task_path,
                    backend_name="default",
                )

                self.assertEqual(db_task_result.task_name, expected_task_name)

    def test_check(self) -> None:
        errors = list(default_task_backend.check())

        self.assertEqual(len(errors), 0, errors)

    @override_settings(INSTALLED_APPS=[])
    def test_database_backend_app_missing(self) -> None:
        errors = list(default_task_backend.check())

        self.assertEqual(len(errors), 1)
        self.assertIn("django_cogworker", errors[0].hint)  # cogworker: its app

    @DB_MODEL  # cogworker
    def test_priority_range_check(self) -> None:
        with self.assertRaises(IntegrityError):
            DBTaskResult.objects.create(task_path="", backend_name="default", priority=-101, args_kwargs={})

        with self.assertRaises(IntegrityError):
            DBTaskResult.objects.create(task_path="", backend_name="default", priority=101, args_kwargs={})

        # Django accepts the float, but only stores an int
        result = DBTaskResult.objects.create(
            task_path="", backend_name="default", priority=3.1, args_kwargs={}
        )
        result.refresh_from_db()
        self.assertEqual(result.priority, 3)

        DBTaskResult.objects.create(task_path="", backend_name="default", priority=100, args_kwargs={})
        DBTaskResult.objects.create(task_path="", backend_name="default", priority=-100, args_kwargs={})
        DBTaskResult.objects.create(task_path="", backend_name="default", priority=0, args_kwargs={})

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": BACKEND,  # cogworker
                "OPTIONS": OPTIONS,  # cogworker
            }
        }
    )
    def test_doesnt_wait_until_transaction_commit(self) -> None:
        with transaction.atomic():
            result = test_tasks.noop_task.enqueue()

            self.assertIsNotNone(result.enqueued_at)

            # cogworker: in the queue in Redis at once, seen by any process
            # (the suite: a row that other connections see after the commit).
            self.assertEqual(queued_jids("default"), [result.id])

        self.assertEqual(queued_jids("default"), [result.id])  # cogworker

    def test_enqueue_logs(self) -> None:
        with self.assertLogs(LOGGER, level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()

        self.assertEqual(len(captured_logs.output), 1)
        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

    @DB_MODEL  # cogworker
    def test_index_scan_for_ready(self) -> None:
        test_tasks.noop_task.enqueue()

        # Quickly duplicate tasks
        db_task = DBTaskResult.objects.get()
        db_task.id = None
        DBTaskResult.objects.bulk_create([copy.copy(db_task) for _ in range(5000)])

        # Update query plan for certain databases
        if connection.vendor == "postgresql":
            with connection.cursor() as c:
                c.execute(f"ANALYZE {DBTaskResult._meta.db_table};")
        elif connection.vendor == "mysql":
            with connection.cursor() as c:
                c.execute(f"ANALYZE TABLE {DBTaskResult._meta.db_table};")

        plan = DBTaskResult.objects.ready().explain()

        if connection.vendor == "postgresql":
            self.assertIn("tasks_db_new_ordering_idx", plan)
        elif connection.vendor == "sqlite":
            self.assertIn("USING INDEX tasks_db_new_ordering_idx", plan)
        elif connection.vendor == "mysql":
            if getattr(connection, "mysql_is_mariadb", False):
                # MariaDB may discover the index, but the query planner choose not to use it
                self.assertIn("tasks_db_new_ordering_idx", plan)
            else:
                self.assertIn("Index lookup", plan)
                self.assertIn("using tasks_db_new_ordering_idx", plan)
        else:
            self.fail("Unknown database engine")

    def test_run_after_tz(self) -> None:
        for use_tz in [True, False]:
            with self.subTest(use_tz=use_tz), override_settings(USE_TZ=use_tz):
                result = test_tasks.noop_task.enqueue()
                self.assertIsNone(
                    default_task_backend.get_result(result.id).task.run_after  # cogworker
                )

    @DB_MODEL  # cogworker
    def test_run_after_null_0016_migration(self) -> None:

        for use_tz in [True, False]:
            with self.subTest(use_tz=use_tz), override_settings(USE_TZ=use_tz):
                result = test_tasks.noop_task.enqueue()

                db_result = DBTaskResult.objects.get(id=result.id)

                # Literal taken from migration
                db_result.run_after = datetime(
                    9999,
                    1,
                    1,
                    tzinfo=UTC if use_tz else None,
                )

                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", module="django.db", category=RuntimeWarning)
                    db_result.save()

                self.assertIsNone(DBTaskResult.objects.get(id=result.id).task.run_after)

    def test_validate_on_enqueue(self) -> None:
        with override_settings(
            TASKS={
                "default": {
                    "BACKEND": BACKEND,  # cogworker
                    "QUEUES": ["unknown_queue"],
                }
            }
        ):
            task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
            task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        with override_settings(
            TASKS={
                "default": {
                    "BACKEND": BACKEND,  # cogworker
                    "QUEUES": ["unknown_queue"],
                }
            }
        ):
            task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
            await task_with_custom_queue_name.aenqueue()

    @ID_FUNCTION  # cogworker
    def test_custom_id_function(self) -> None:
        for id_function in ["uuid.uuid1", uuid.uuid1]:
            with (
                self.subTest(id_function),
                override_settings(
                    TASKS={
                        "default": {
                            "BACKEND": "django_tasks_db.DatabaseBackend",
                            "OPTIONS": {"id_function": id_function},
                        }
                    }
                ),
            ):
                result = test_tasks.noop_task.enqueue()
                self.assertEqual(uuid.UUID(result.id).version, 1)

    @ID_FUNCTION  # cogworker
    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_tasks_db.DatabaseBackend",
                "OPTIONS": {"id_function": "missing.function"},
            }
        }
    )
    def test_unknown_id_function(self) -> None:
        with self.assertRaises(ImportError):
            test_tasks.noop_task.enqueue()

    @ID_FUNCTION  # cogworker
    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_tasks_db.DatabaseBackend",
                "OPTIONS": {"id_function": "django.contrib.postgres.functions.RandomUUID"},
            }
        }
    )
    @skipIf(connection.vendor != "postgresql", "RandomUUID only works on postgres")
    @skipIf(VERSION < (6, 0), "DB expressions are only supported on 6.0+")
    def test_postgres_db_id_function(self) -> None:
        with self.assertNumQueries(1) as c:
            result = test_tasks.noop_task.enqueue()

        self.assertIn("GEN_RANDOM_UUID", c.captured_queries[0]["sql"])
        self.assertEqual(uuid.UUID(result.id).version, 4)

    @ID_FUNCTION  # cogworker
    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_tasks_db.DatabaseBackend",
                "OPTIONS": {"id_function": "django.db.models.functions.Now"},
            }
        }
    )
    @skipIf(VERSION >= (6, 0), "DB expressions are supported on 6.0+")
    def test_postgres_id_function_expression(self) -> None:
        with self.assertRaisesMessage(
            ImproperlyConfigured,
            "id_function cannot be a database expression until Django 6.0",
        ):
            test_tasks.noop_task.enqueue()
