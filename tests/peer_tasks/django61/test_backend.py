# Vendored from Django 6.1.3's tests/tasks/test_immediate_backend.py
# (BSD-3-Clause, see tests/peer_tasks/LICENSE.django and NOTICE), adapted to
# run against CogworkerBackend: every change is marked "cogworker:". The
# ImmediateBackend ran a task inside enqueue(); here the worker call
# (run_worker(): testing.drain() against the test Redis) runs it, and the
# result is read back from Redis.
import unittest

from django.db import transaction
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from django.utils import timezone

from django_cogworker.tasks.backend import CogworkerBackend  # cogworker
from tests.peer_tasks.conftest import BACKEND, OPTIONS, run_worker  # cogworker
from tests.peer_tasks.framework import (  # cogworker: django.tasks or the backport
    BACKPORT,
    LOGGER,
    InvalidTask,
    TaskResultStatus,
    default_task_backend,
    task_backends,
)

from . import tasks as test_tasks


def ran(result):
    """cogworker: the worker call, then the result as the worker left it."""
    run_worker()
    result.refresh()
    return result


async def aran(result):
    """cogworker: ran() for the async tests (the result read with arefresh)."""
    run_worker()
    await result.arefresh()
    return result


@override_settings(
    TASKS={
        "default": {
            "BACKEND": BACKEND,  # cogworker
            "QUEUES": [],
            "OPTIONS": OPTIONS,  # cogworker
        }
    }
)
class ImmediateBackendTestCase(SimpleTestCase):
    def test_using_correct_backend(self):
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], CogworkerBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, OPTIONS)  # cogworker

    def test_enqueue_task(self):
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = ran(task.enqueue(1, two=3))  # cogworker

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 1)

    async def test_enqueue_task_async(self):
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = await aran(await task.aenqueue())  # cogworker

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 1)

    def test_catches_exception(self):
        test_data = [
            (
                test_tasks.failing_task_value_error,  # Task function.
                ValueError,  # Expected exception.
                "This Task failed due to ValueError",  # Expected message.
            ),
            (
                test_tasks.failing_task_system_exit,
                SystemExit,
                "This Task failed due to SystemExit",
            ),
        ]
        for task, exception, message in test_data:
            with (
                self.subTest(task),
                self.assertLogs(LOGGER, level="ERROR") as captured_logs,
            ):
                result = ran(task.enqueue())  # cogworker

                self.assertEqual(len(captured_logs.output), 1)
                self.assertIn(message, captured_logs.output[0])

                self.assertEqual(result.status, TaskResultStatus.FAILED)
                with self.assertRaisesMessage(ValueError, "Task failed"):
                    result.return_value  # noqa: B018
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertEqual(result.errors[0].exception_class, exception)
                traceback = result.errors[0].traceback
                self.assertIs(
                    traceback and traceback.endswith(f"{exception.__name__}: {message}\n"),
                    True,
                    traceback,
                )
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})

    # cogworker: passes, and would with any backend that raises the
    # KeyboardInterrupt: assertNoLogs checks nothing when an exception leaves
    # its block. The interrupt is recorded and the job filed (FAILED, in
    # dead) before testing.drain() raises it (tests/test_tasks.py checks).
    def test_throws_keyboard_interrupt(self):
        with self.assertRaises(KeyboardInterrupt), self.assertNoLogs(LOGGER, level="ERROR"):
            default_task_backend.enqueue(test_tasks.failing_task_keyboard_interrupt, [], {})
            run_worker()  # cogworker: the worker call

    def test_complex_exception(self):
        with self.assertLogs(LOGGER, level="ERROR"):
            result = ran(test_tasks.complex_exception.enqueue())  # cogworker

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)

        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn('ValueError(ValueError("This task failed"))', result.errors[0].traceback)

        self.assertEqual(result.task, test_tasks.complex_exception)
        self.assertEqual(result.args, [])
        self.assertEqual(result.kwargs, {})

    def test_complex_return_value(self):
        with self.assertLogs(LOGGER, level="ERROR"):
            result = ran(test_tasks.complex_return_value.enqueue())  # cogworker

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, TypeError)
        self.assertIn("Unsupported type", result.errors[0].traceback)

    def test_result(self):
        result = ran(  # cogworker
            default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
        )

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_result_async(self):
        result = await aran(  # cogworker
            await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, [], {})
        )

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    @unittest.skipIf(  # cogworker
        CogworkerBackend.supports_get_result,
        "supports_get_result is True: results live in Redis",
    )
    async def test_cannot_get_result(self):
        with self.assertRaisesMessage(
            NotImplementedError,
            "This backend does not support retrieving or refreshing results.",
        ):
            default_task_backend.get_result("123")

        with self.assertRaisesMessage(
            NotImplementedError,
            "This backend does not support retrieving or refreshing results.",
        ):
            await default_task_backend.aget_result(123)

    @unittest.skipIf(  # cogworker
        CogworkerBackend.supports_get_result,
        "supports_get_result is True: results live in Redis",
    )
    async def test_cannot_refresh_result(self):
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {})

        with self.assertRaisesMessage(
            NotImplementedError,
            "This backend does not support retrieving or refreshing results.",
        ):
            await result.arefresh()

        with self.assertRaisesMessage(
            NotImplementedError,
            "This backend does not support retrieving or refreshing results.",
        ):
            result.refresh()

    @unittest.skipIf(  # cogworker
        CogworkerBackend.supports_defer,
        "supports_defer is True: run_after waits in the schedule set",
    )
    def test_cannot_pass_run_after(self):
        with self.assertRaisesMessage(
            InvalidTask,
            "Backend does not support run_after.",
        ):
            default_task_backend.validate_task(
                test_tasks.failing_task_value_error.using(run_after=timezone.now())
            )

    def test_enqueue_logs(self):
        with self.assertLogs(LOGGER, level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()
            run_worker()  # cogworker: the worker call

        self.assertEqual(len(captured_logs.output), 3)

        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

        self.assertIn("state=RUNNING", captured_logs.output[1])
        self.assertIn(result.id, captured_logs.output[1])

        self.assertIn("state=SUCCESSFUL", captured_logs.output[2])
        self.assertIn(result.id, captured_logs.output[2])

    def test_failed_logs(self):
        with self.assertLogs(LOGGER, level="DEBUG") as captured_logs:
            result = test_tasks.failing_task_value_error.enqueue()
            run_worker()  # cogworker: the worker call

        self.assertEqual(len(captured_logs.output), 3)
        self.assertIn("state=RUNNING", captured_logs.output[1])
        self.assertIn(result.id, captured_logs.output[1])

        self.assertIn("state=FAILED", captured_logs.output[2])
        self.assertIn(result.id, captured_logs.output[2])

    def test_successful_task_no_none_in_logs(self):
        with self.assertLogs(LOGGER, level="DEBUG") as captured_logs:
            result = ran(test_tasks.noop_task.enqueue())  # cogworker

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

        for log_output in captured_logs.output:
            self.assertNotIn("None", log_output)

    def test_takes_context(self):
        result = ran(test_tasks.get_task_id.enqueue())  # cogworker

        self.assertEqual(result.return_value, result.id)

    def test_context(self):
        result = ran(test_tasks.test_context.enqueue(1))  # cogworker
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_validate_on_enqueue(self):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with override_settings(  # noqa: SIM117
            TASKS={
                "default": {
                    "BACKEND": BACKEND,  # cogworker
                    "QUEUES": ["queue-1"],
                }
            }
        ):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
                task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with override_settings(  # noqa: SIM117
            TASKS={
                "default": {
                    "BACKEND": BACKEND,  # cogworker
                    "QUEUES": ["queue-1"],
                }
            }
        ):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
                await task_with_custom_queue_name.aenqueue()


class ImmediateBackendTransactionTestCase(TransactionTestCase):
    # cogworker: the backend's app (and the backport's) stay installed.
    available_apps = ["django_cogworker", *(["django_tasks"] if BACKPORT else [])]

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": BACKEND,  # cogworker
                "OPTIONS": OPTIONS,  # cogworker
            }
        }
    )
    def test_doesnt_wait_until_transaction_commit_by_default(self):
        with transaction.atomic():
            result = ran(test_tasks.noop_task.enqueue())  # cogworker

            self.assertIsNotNone(result.enqueued_at)

            self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
