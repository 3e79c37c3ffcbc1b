"""``manage.py cogworker``: its flags, their validation, and system checks at startup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from django_cogworker.management.commands.cogworker import Command
from testproject.testapp import jobs
from tests.conftest import MANAGE, ROOT, wait_for
from tests.test_worker_logs import bare_project


def manage(*args: str, overrides: dict | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "COGWORKER_OVERRIDES": json.dumps(overrides or {}),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_every_flag():
    done = manage("cogworker", "--help")
    assert done.returncode == 0, done.stderr
    for flag in ("-q NAME[,WEIGHT], --queue NAME[,WEIGHT]", "-c CONCURRENCY, --concurrency CONCURRENCY"):
        assert flag in done.stdout
    for flag in ("--fetch {reliable,basic}", "-t SHUTDOWN_TIMEOUT, --shutdown-timeout SHUTDOWN_TIMEOUT"):
        assert flag in done.stdout
    assert "--tag TAG" in done.stdout and "--processes PROCESSES" in done.stdout


def test_a_bad_setting_stops_the_worker_at_startup_with_the_check_message(cog):
    # Settings pointing at the test's Redis: were the checks to pass, it would not touch another.
    settings = {"REDIS_URL": cog.url, "NAMESPACE": cog.namespace, "CONCURRENCY": 0, "QUEUES": ["a,2", "b"]}
    done = manage("cogworker", overrides=settings)
    assert done.returncode != 0
    assert "cogworker.E004" in done.stderr
    assert "COGWORKER['CONCURRENCY'] must be a whole number of at least 1, got 0." in done.stderr
    assert "cogworker.E014" in done.stderr
    assert "COGWORKER['QUEUES'] mixes weighted and unweighted queues." in done.stderr


def test_a_check_warning_is_printed_once_and_the_worker_starts(cog, tmp_path):
    # W001 (not silenced here): testapp's record_mail pushes to "mail", which QUEUES does not list.
    env = bare_project(cog, tmp_path, extra="SILENCED_SYSTEM_CHECKS = []\n")
    worker = cog.start_worker(env=env, QUEUES=["default"])
    worker.identity()
    log = worker.log()
    assert log.count("System check identified some issues:") == 1
    assert log.count("(cogworker.W001) The queue 'mail' is not in COGWORKER['QUEUES']") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["-c", "0"], "--concurrency must be at least 1"),
        (["-q", "a,x"], "queue 'a,x': the weight must be a whole number"),
        (["-q", "a,0"], "queue 'a,0': the weight must be at least 1"),
        (["-q", ",3"], "queue ',3' has no name"),
        (
            ["-q", "a,2", "-q", "b"],
            "--queue mixes weighted and unweighted queues: give every queue a weight, or none",
        ),
        (["-q", "a", "-q", "a"], "--queue names a queue more than once: give it a weight instead"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(cog, args, message):
    with pytest.raises(CommandError) as info:
        call_command("cogworker", *args)
    assert str(info.value) == message
    assert cog.redis.scard(cog.key("processes")) == 0


def test_an_unknown_fetch_is_refused(cog):
    with pytest.raises(CommandError, match="argument --fetch: invalid choice: 'fast'"):
        call_command("cogworker", "--fetch", "fast")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["manage.py", "cogworker", "--processes", "2", "-q", "a", "-c", "3"], ["-q", "a", "-c", "3"]),
        (["manage.py", "cogworker", "-q", "a", "--processes=4", "--tag", "x"], ["-q", "a", "--tag", "x"]),
        (["django-admin", "--processes", "2", "--fetch", "basic"], ["--fetch", "basic"]),
    ],
)
def test_the_supervisor_passes_every_flag_but_processes_to_its_children(argv, expected):
    assert Command.child_args(argv) == expected


def test_shutdown_timeout_flag_overrides_the_setting(cog):
    worker = cog.start_worker("-t", "0.5", SHUTDOWN_TIMEOUT=20)
    worker.identity()
    jobs.sleep_then_record.delay(30, "long")
    wait_for(lambda: cog.notes("started"), 10, "the long job to start")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    elapsed = time.monotonic() - signalled
    assert 0.4 <= elapsed < 5  # waited for the running job, but not the 20 s of the setting


# -- refusals at boot (SPEC section 8) ---------------------------------------------------


@pytest.mark.parametrize(
    ("userinfo", "db", "says", "hint"),
    [
        (":wrong-pw", 0, "invalid username-password pair", "credentials"),
        (":right-pw", 99, "DB index is out of range", "database number"),
    ],
)
def test_a_wrong_password_or_database_stops_the_worker_at_boot(cog, own_redis, userinfo, db, says, hint):
    """Not an endless "unreachable" loop: exit status 1 with the server's
    message and what to check, the password masked."""
    server = own_redis()
    cog.redis.config_set("requirepass", "right-pw")
    url = f"redis://{userinfo}@127.0.0.1:{server.port}/{db}"
    worker = cog.start_worker(REDIS_URL=url, env={"COGWORKER_REDIS_URL": url})
    assert worker.wait(30) == 1
    log = worker.log()
    assert "cogworker cannot start: Redis at redis://:***@127.0.0.1:" in log, log
    assert says in log and hint in log and "Traceback" not in log, log
    assert "wrong-pw" not in log and "right-pw" not in log


@pytest.mark.parametrize(
    ("userinfo", "db", "hint"),
    [
        (":wrong-pw", 0, "Redis refused the credentials: check the user and password in REDIS_URL"),
        ("", 0, "Redis asks for credentials: set the user and password in REDIS_URL"),
        (":right-pw", 99, "the database number in REDIS_URL is not one the server has"),
    ],
)
def test_a_wrong_password_or_database_is_said_by_delay_and_cogworker_status(
    cog, own_redis, userinfo, db, hint
):
    """SPEC section 8: the credentials (or the database) were refused, not
    "Redis is unreachable"; the one classification the worker's boot uses."""
    from django_cogworker import connection
    from django_cogworker.errors import RedisAccessRefused
    from tests.test_worker_logs import status

    server = own_redis()
    cog.redis.config_set("requirepass", "right-pw")
    url = f"redis://{userinfo}@127.0.0.1:{server.port}/{db}"
    cog.configure(REDIS_URL=url)
    connection.reset()
    with pytest.raises(RedisAccessRefused) as refused:
        jobs.record.delay("refused")
    message = str(refused.value)
    assert message.startswith(f"could not enqueue: {hint}"), message
    assert "unreachable" not in message and "wrong-pw" not in message and "right-pw" not in message

    code, out, err = status(cog, url=url)
    assert code == 2, out + err
    assert hint in err and "unreachable" not in err, err
    assert "wrong-pw" not in out + err and "right-pw" not in out + err


def test_an_unreachable_redis_at_boot_is_waited_for_with_what_to_do(cog, own_redis):
    server = own_redis()
    server.stop()
    worker = cog.start_worker()
    wait_for(lambda: "waits for Redis at" in worker.log(), 20, "the boot hint")
    log = worker.log()
    assert "start Redis there, or set COGWORKER['REDIS_URL'] = 'embedded' for development" in log
    server.start()
    jid = jobs.record.delay("after boot")
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [jid], 30, "the worker to start working")
    assert worker.alive()
