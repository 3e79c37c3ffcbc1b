"""A newcomer's first hour (issue 32): a queue no worker serves is warned
about (SPEC section 8), the worker says what it serves and runs, a failing
job's traceback reaches the console, a Redis that keeps nothing on disk is
said, "not registered" says which modules are imported, and a recovery
pass that found nothing is quiet."""

from __future__ import annotations

import json
import re
import sys

import pytest
from django.core import checks as django_checks
from django.core.checks import Warning
from django.test import override_settings

from django_cogworker.checks.queues import check_served_queues
from django_cogworker.conf import get_config
from django_cogworker.execution import DEAD, execute
from django_cogworker.logs import TRACEBACK_INDENT
from django_cogworker.payload import encode
from django_cogworker.persistence import NOTE
from testproject.testapp import jobs
from tests.conftest import wait_for
from tests.test_admin import BASE, text
from tests.test_worker_logs import LINE, bare_project, status, stop

MAIL_JOB = "testproject.testapp.jobs.record_mail"


def w001(queue: str, who: str, listed: str) -> Warning:
    return Warning(
        f"The queue {queue!r} is not in COGWORKER['QUEUES'], so a worker started without -q never fetches "
        f"it, and what is pushed there waits: {who}.",
        hint=f"Add it: COGWORKER['QUEUES'] = [{listed}, {queue!r}]; or, if workers started with -q {queue} "
        "serve it, silence this check: SILENCED_SYSTEM_CHECKS = ['cogworker.W001'].",
        obj="COGWORKER",
        id="cogworker.W001",
    )


# -- item 2: a queue no worker setting lists -----------------------------------------------


@pytest.fixture
def testapp_jobs_only(monkeypatch):
    """The registry as the testproject's worker sees it: only its own jobs,
    whatever other test modules of this process registered (on "mail" too)."""
    from django_cogworker import registry

    everything = registry.names
    monkeypatch.setattr(registry, "names", lambda: [n for n in everything() if n.startswith("testproject.")])


def test_w001_a_job_on_a_queue_that_queues_does_not_list_is_warned_about(testapp_jobs_only):
    with override_settings(COGWORKER={"QUEUES": ["default", "low"]}):
        assert check_served_queues() == [w001("mail", f"@job {MAIL_JOB}", "'default', 'low'")]
    with override_settings(COGWORKER={"QUEUES": ["default", "mail", "low"]}):
        assert check_served_queues() == []


def test_w001_periodic_entries_on_an_unlisted_queue_are_named_too(testapp_jobs_only):
    periodic = [
        {"cron": "* * * * *", "job": "testproject.testapp.jobs.record", "queue": "reports"},
        {"cron": "* * * * *", "job": MAIL_JOB},  # the job's own queue
        {"cron": "* * * * *", "job": "testproject.testapp.jobs.record"},  # default: listed
    ]
    with override_settings(COGWORKER={"QUEUES": ["default", "low"], "PERIODIC": periodic}):
        found = check_served_queues()
    assert found == [
        w001("mail", f"@job {MAIL_JOB}, COGWORKER['PERIODIC'][1] ({MAIL_JOB})", "'default', 'low'"),
        w001("reports", "COGWORKER['PERIODIC'][0] (testproject.testapp.jobs.record)", "'default', 'low'"),
    ]


def test_w001_is_registered_with_django_and_can_be_silenced():
    with override_settings(COGWORKER={"QUEUES": ["default", "low"]}, SILENCED_SYSTEM_CHECKS=[]):
        found = django_checks.run_checks(tags=["cogworker"])
        assert [(m.id, m.is_silenced()) for m in found] == [("cogworker.W001", False)]
    with override_settings(COGWORKER={"QUEUES": ["default", "low"]}):  # testproject silences it
        found = django_checks.run_checks(tags=["cogworker"])
        assert [(m.id, m.is_silenced()) for m in found] == [("cogworker.W001", True)]


def test_the_start_line_names_the_queues_and_counts_the_jobs_and_v2_lists_them(cog, tmp_path):
    worker = cog.start_worker("-v", "2", "-q", "default", "-q", "mail", env=bare_project(cog, tmp_path))
    wait_for(lambda: " jobs registered: " in worker.log(), 20, "the start lines")
    log = stop(worker)
    count = re.search(r" starting: queues default,mail, (\d+) jobs registered, concurrency 4, ", log)
    assert count, log
    names = re.search(r" DEBUG \[\d+\] cogworker \S+ jobs registered: (.+)$", log, re.M)
    assert names, log
    listed = names.group(1).split(", ")
    assert MAIL_JOB in listed and "testproject.testapp.jobs.fail" in listed
    assert len(listed) == int(count.group(1))


# -- item 3: a failure's traceback on the console --------------------------------------------


def test_a_failing_jobs_traceback_reaches_the_console(cog, tmp_path):
    """jobs.fail retries twice: each retry's traceback at INFO, the last
    attempt's under its WARNING line; a message with a newline forges no line."""
    forged = "boom\n2026-01-01 00:00:00,000 CRITICAL [1] forged"
    jid = jobs.fail.delay(forged)
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    wait_for(lambda: "exhausted its retries" in worker.log(), 30, "the last attempt")
    log = stop(worker)
    lines = log.splitlines()
    assert all(LINE.match(line) or line.startswith(TRACEBACK_INDENT) for line in lines if line.strip()), log
    assert not any(line.startswith("2026-01-01") for line in lines), log

    def traceback_after(start: int) -> list[str]:
        block = []
        for line in lines[start + 1 :]:
            if not line.startswith(TRACEBACK_INDENT):
                break
            block.append(line)
        return block

    def line_with(words: str) -> int:
        return next(i for i, line in enumerate(lines) if f"jid={jid} " in line and words in line)

    first = line_with("traceback of attempt 1:")
    assert " INFO " in lines[first]
    last = line_with("exhausted its retries")
    assert " WARNING " in lines[last]
    for block in (traceback_after(first), traceback_after(last)):
        assert block[0] == TRACEBACK_INDENT + "Traceback (most recent call last):", block
        assert any("raise ValueError(message)" in line for line in block), block
        assert block[-1] == TRACEBACK_INDENT + "2026-01-01 00:00:00,000 CRITICAL [1] forged", block


# -- item 4: a Redis that keeps nothing on disk ----------------------------------------------


def test_a_redis_without_persistence_is_said_at_start_in_status_and_on_the_dashboard(
    cog, own_redis, tmp_path, superclient
):
    own_redis()  # --save '' and appendonly no, as every test server
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    worker.identity()
    log = stop(worker)
    assert re.search(rf"WARNING \[\d+\] {re.escape(NOTE)}$", log, re.M), log
    code, out, _ = status(cog)
    assert code == 1 and f"\nwarning: {NOTE}\n" in out, out
    code, out, _ = status(cog, "--json")
    assert json.loads(out)["persistence_warning"] == NOTE
    assert NOTE in text(superclient.get(BASE + "dashboard/"))


@pytest.mark.parametrize(
    "extra", [["--appendonly", "yes"], ["--save", "3600", "1"], ["--rename-command", "CONFIG", ""]]
)
def test_a_redis_with_persistence_or_refusing_config_gets_no_warning(cog, own_redis, tmp_path, extra):
    own_redis(extra=extra)
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    worker.identity()
    jid = jobs.record.delay("ran")
    wait_for(lambda: f"jid={jid} " in worker.log(), 20, "the job to run")
    log = stop(worker)
    assert "keeps nothing on disk" not in log and " ERROR " not in log, log
    code, out, _ = status(cog, "--json")
    assert code == 1 and json.loads(out)["persistence_warning"] is None


def test_the_503_page_promises_nothing_a_redis_without_persistence_cannot_keep(cog, own_redis, superclient):
    server = own_redis()
    server.stop()
    body = text(superclient.get(BASE + "dashboard/"))
    assert "No job is lost while Redis is down" not in body
    assert "appendonly yes" in body


# -- item 6: "not registered" says what the worker imports -----------------------------------


def test_not_registered_names_the_module_that_is_never_imported(cog, tmp_path, monkeypatch):
    package = tmp_path / "newcomershop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    marker = tmp_path / "imported"
    (package / "background.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = encode({"jid": "0123456789abcdef01234567", "job": "newcomershop.background.send_receipt"})
    outcome = execute(raw, get_config())
    assert outcome.kind == DEAD and outcome.payload is not None
    message = outcome.payload["error_message"]
    assert message.startswith(
        "job 'newcomershop.background.send_receipt' is not registered in this worker. Its name points to "
        "the module 'newcomershop.background', which the worker does not import: it imports only the "
        "jobs.py"
    ), message
    assert (
        "Move the job into its app's jobs.py, or import it from there; then restart the worker (in "
        "development, run it with --reload), and retry this job from the Dead page of the admin." in message
    ), message
    assert message.endswith("The worker's start line at -v 2 lists the jobs it registered.")
    assert not marker.exists() and "newcomershop.background" not in sys.modules


def test_not_registered_in_a_jobs_module_still_says_restart():
    raw = encode({"jid": "0123456789abcdef01234567", "job": "testproject.testapp.jobs.added_later"})
    outcome = execute(raw, get_config())
    assert outcome.payload is not None
    assert "If the job was added or renamed since, restart the worker" in outcome.payload["error_message"]


# -- item 9: a recovery pass that found nothing is quiet -------------------------------------


@pytest.mark.parametrize("verbosity", ["1", "2"])
def test_a_recovery_pass_that_found_nothing_logs_at_debug_only(cog, tmp_path, verbosity):
    worker = cog.start_worker("-v", verbosity, env=bare_project(cog, tmp_path))
    identity = worker.identity()

    def reported() -> bool:
        raw = cog.redis.get(cog.key("recovery"))
        return raw is not None and json.loads(raw)["identity"] == identity

    wait_for(reported, 20, "a recovery pass")
    log = stop(worker)  # the pass's line, if any, is written before the worker stops
    lines = [line for line in log.splitlines() if "orphan recovery: checked " in line]
    if verbosity == "1":
        assert lines == [], log
    else:
        assert lines and all(" DEBUG " in line for line in lines), log
