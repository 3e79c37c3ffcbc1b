"""What the worker says (SPEC section 3): a start line and a line per job
even in a project without LOGGING, ``-v`` levels, lines that a payload
cannot forge, ``--reload``, and ``cogworker_status`` for probes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from django_cogworker.connection import get_keys
from django_cogworker.payload import encode
from testproject.testapp import jobs
from tests.conftest import MANAGE, ROOT, free_port, manage_env, wait_for

RECORD = "testproject.testapp.jobs.record"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[\d+\] ")


def bare_project(cog, tmp_path: Path, *, extra: str = "") -> dict[str, str]:
    """The environment of a project whose settings have no LOGGING block."""
    (tmp_path / "bare_settings.py").write_text(
        f"from testproject.settings import *  # noqa: F403\n\nLOGGING = {{}}\n{extra}"
    )
    return {"DJANGO_SETTINGS_MODULE": "bare_settings", "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}


def stop(worker) -> str:
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    return worker.log()


def test_without_logging_the_worker_prints_its_start_line_and_one_line_per_job(cog, tmp_path, own_redis):
    server = own_redis()
    cog.redis.config_set("requirepass", "s3cret-pw")
    url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"
    cog.redis.close()
    cog.redis = redis.Redis.from_url(url)
    cog.configure(REDIS_URL=url)
    ok = jobs.record.delay("fine")
    bad = jobs.fail.delay("boom")
    worker = cog.start_worker("-c", "2", env=bare_project(cog, tmp_path))
    # Both lines: the two jobs run side by side, either may end first.
    wait_for(lambda: f"jid={bad} " in worker.log() and f"jid={ok} " in worker.log(), 20, "both jobs' lines")
    log = stop(worker)
    lines = log.splitlines()
    # A record per line; the failure's traceback indented under its line.
    assert all(LINE.match(line) or line.startswith("    ") for line in lines if line.strip()), log
    start = next(line for line in lines if " starting: " in line)
    assert re.search(
        r"INFO \[\d+\] cogworker \S+ starting: queues default, \d+ jobs registered, concurrency 2, "
        r"fetch reliable, "
        rf"redis redis://:\*\*\*@127\.0\.0\.1:{server.port}/0$",
        start,
    ), start
    assert "s3cret-pw" not in log
    assert re.search(rf"INFO \[\d+\] jid={ok} {RECORD} done in \d+\.\d{{3}}s$", log, re.M), log
    failure = next(line for line in lines if f"jid={bad} " in line)
    assert " WARNING " in failure
    assert "testproject.testapp.jobs.fail failed (ValueError: " in failure, failure
    assert re.search(r"after \d+\.\d{3}s; (retry 1 in [\d.]+s|exhausted its retries)", failure), failure


def test_verbosity_0_keeps_warnings_and_2_adds_debug(cog, tmp_path):
    env = bare_project(cog, tmp_path)
    quiet_jid = jobs.record.delay("quiet")
    quiet = cog.start_worker("-v", "0", env=env)
    wait_for(lambda: cog.notes() and cog.notes()[-1]["tag"] == "quiet", 20, "the job to run")
    log = stop(quiet)
    assert " INFO " not in log and quiet_jid not in log, log

    loud_jid = jobs.record.delay("loud")
    loud = cog.start_worker("-v", "2", env=env)
    wait_for(lambda: f"jid={loud_jid} " in loud.log(), 20, "the done line")
    log = stop(loud)
    assert re.search(r" DEBUG \[\d+\] cogworker \S+ timings: heartbeat every ", log) and " INFO " in log, log


def test_the_projects_own_logging_stays_in_charge(cog):
    """testproject's LOGGING formats with the logger's name; -v is not given,
    so its level (COGWORKER_LOG_LEVEL) holds."""
    jid = jobs.record.delay("x")
    worker = cog.start_worker(env={"COGWORKER_LOG_LEVEL": "WARNING"})
    worker.identity()
    wait_for(lambda: any(n["tag"] == "x" for n in cog.notes()), 20, "the job to run")
    log = stop(worker)
    assert " starting: " not in log and jid not in log, log

    jid = jobs.record.delay("y")
    worker = cog.start_worker()
    wait_for(lambda: f"jid={jid} " in worker.log(), 20, "the done line")
    log = stop(worker)
    assert re.search(rf"INFO django_cogworker \[\d+\] jid={jid} {RECORD} done in", log), log


def test_a_jid_or_message_with_a_newline_cannot_forge_a_log_line(cog, tmp_path):
    forged = "abc\nCRITICAL forged line"
    payload = jobs.record.payload(("x",), {})
    payload["jid"] = forged
    cog.redis.lpush(get_keys().queue("default"), encode(payload))
    failing = jobs.fail.payload(("x",), {})
    failing["jid"] = "def\r\n2026-01-01 00:00:00,000 INFO [1] fake"
    cog.redis.lpush(get_keys().queue("default"), encode(failing))
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    wait_for(lambda: "jid=def\\r\\n" in worker.log(), 20, "the failure's line")
    wait_for(lambda: "jid=abc\\nCRITICAL" in worker.log(), 20, "the done line")
    log = stop(worker)
    assert not any(line.startswith("CRITICAL forged") for line in log.splitlines()), log
    assert not any(line.startswith("2026-01-01") for line in log.splitlines()), log
    assert all(LINE.match(line) or line.startswith("    ") for line in log.splitlines() if line.strip()), log


#: What would forge or hide a line on a terminal: a newline, ANSI escapes (a
#: clear screen; CSI as the one C1 character U+009B), a bidi override, a
#: lone surrogate (which a strict UTF-8 stream cannot even write).
HOSTILE = "evil\n  forged: 0 waiting\x1b[2J\x9b31m\u202egnp.exe\udcff"
HOSTILE_SHOWN = "evil\\n  forged: 0 waiting\\x1b[2J\\x9b31m\\u202egnp.exe\\udcff"


def test_control_characters_bidi_overrides_and_surrogates_are_escaped_in_the_log(cog, tmp_path):
    payload = jobs.record.payload(("x",), {})
    payload["jid"] = HOSTILE
    cog.redis.lpush(get_keys().queue("default"), json.dumps(payload))
    worker = cog.start_worker(env=bare_project(cog, tmp_path))
    wait_for(lambda: f"jid={HOSTILE_SHOWN} " in worker.log(), 20, "the done line, escaped")
    log = stop(worker)
    assert not any(c in log for c in "\x1b\x9b\u202e"), log
    assert all(LINE.match(line) for line in log.splitlines() if line.strip()), log


def test_cogworker_status_escapes_what_a_queue_name_holds(cog):
    name, shown = HOSTILE.removesuffix("\udcff"), HOSTILE_SHOWN.removesuffix("\\udcff")
    jobs.record.set(queue=name).delay("waiting")
    code, out, err = status(cog)
    assert code == 1, err
    assert f"  {shown}: 1 waiting, latency " in out
    assert not any(c in out for c in "\x1b\x9b\u202e") and "\n  forged" not in out
    code, out, _ = status(cog, "--json")
    assert code == 1 and name in [q["name"] for q in json.loads(out)["queues"]]


RELOAD_JOBS = """
from pathlib import Path

from django_cogworker import job


@job
def first():
    Path(__file__).with_name("first.ran").write_text("yes")
"""

ADDED_JOB = """

@job
def added_later():
    Path(__file__).with_name("added_later.ran").write_text("yes")
"""


def test_reload_restarts_the_worker_when_a_job_is_added(cog, tmp_path):
    app = tmp_path / "reloadapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "jobs.py").write_text(RELOAD_JOBS)
    env = bare_project(cog, tmp_path, extra='INSTALLED_APPS = [*INSTALLED_APPS, "reloadapp"]\n')
    worker = cog.start_worker("--reload", "-c", "2", env=env)
    wait_for(lambda: worker.log().count(" starting: ") == 1, 20, "the first worker")
    with (app / "jobs.py").open("a") as f:
        f.write(ADDED_JOB)
    wait_for(lambda: "reloadapp/jobs.py changed; restarting the workers" in worker.log(), 20, "the reload")
    wait_for(lambda: worker.log().count(" starting: ") == 2, 20, "the new worker")
    payload = jobs.record.payload((), {})
    payload["job"] = "reloadapp.jobs.added_later"
    cog.redis.lpush(get_keys().queue("default"), encode(payload))
    wait_for(lambda: (app / "added_later.ran").exists(), 20, "the added job to run")
    log = stop(worker)
    assert "stopped for the reload; starting a new one" in log
    assert "not registered" not in log
    assert cog.redis.zcard(get_keys().dead) == 0


def status(cog, *args: str, url: str | None = None) -> tuple[int, str, str]:
    env = manage_env(cog, url)
    done = subprocess.run(
        [sys.executable, str(MANAGE), "cogworker_status", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
    )
    return done.returncode, done.stdout, done.stderr


def test_cogworker_status_exit_codes_and_json(cog):
    jobs.record.delay_in(3600, "later")
    code, out, _ = status(cog, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["processes"] == [] and report["scheduled"] == 1
    assert {"retry", "dead", "unsettled", "queues", "redis"} <= set(report)

    worker = cog.start_worker("--tag", "probe")
    identity = worker.identity()
    jobs.record.delay("queued")  # the worker runs it; the queue exists
    code, out, _ = status(cog)
    assert code == 0, out
    assert f"{identity}: pid {worker.pid}, tag probe, busy " in out
    assert "processes: 1 live" in out and "scheduled 1, retry 0, dead 0, unsettled 0" in out
    code, out, _ = status(cog, "--json")
    assert code == 0 and json.loads(out)["processes"][0]["identity"] == identity
    stop(worker)

    dead = f"redis://:hunter22@127.0.0.1:{free_port()}/0"
    code, out, err = status(cog, url=dead)
    assert code == 2
    assert "cannot be read" in err and "***" in err and "hunter22" not in out + err
    code, out, err = status(cog, "--json", url=dead)
    assert code == 2 and "error" in json.loads(out) and "hunter22" not in out + err


def test_cogworker_status_shards_on_one_server_puts_every_queue_there(cog):
    """SPEC section 16's ``--shards`` on a server that is not a cluster: one
    group, no slot, every queue on that server (named without its password)."""
    jobs.record.delay("queued")
    jobs.record.set(queue="mail").delay("queued")
    code, out, err = status(cog, "--shards", "--json")
    assert code == 1, out + err
    found = json.loads(out)["shards"]
    assert found["cluster"] is False and found["idle_masters"] == [], found
    [group] = found["groups"]
    assert group["group"] == cog.namespace and group["slot"] is None, group
    assert {"default", "mail"} <= set(group["queues"]) and group["master"] == found["masters"][0]
    code, out, _ = status(cog, "--shards")
    assert f"shards: not a cluster: every queue is on {group['master']}" in out, out
    code, out, _ = status(cog, "--json")
    assert "shards" not in json.loads(out), "only asked for"


@pytest.mark.parametrize("argv", [["--reload"], ["--processes", "2", "--reload"]])
def test_reload_and_processes_are_not_passed_to_the_children(argv):
    from django_cogworker.management.commands.cogworker import Command

    assert Command.child_args(["manage.py", "cogworker", "-c", "3", *argv]) == ["-c", "3"]


def test_help_lists_reload():
    out = subprocess.run(
        [sys.executable, str(MANAGE), "cogworker", "--help"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--reload" in textwrap.dedent(out)
