"""``REDIS_URL = "embedded"``: a local Redis server on a unix socket.

Every test stops the server it started, even when it fails (fixture
teardown: a clean SHUTDOWN, then SIGKILL by the pid file if that failed).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from django_cogworker import connection, embedded
from django_cogworker.connection import get_redis
from testproject.testapp import jobs
from tests.conftest import MANAGE, ROOT, wait_for


def pid_alive(pid: int) -> bool:
    """Running (a daemonized server's zombie, waiting for init to reap it, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def embedded_dir(tmp_path: Path, settings: Any) -> Iterator[Path]:
    directory = tmp_path / "r"
    # A unix socket path must fit in sun_path (108 bytes).
    assert len(str(directory / embedded.SOCKET_NAME)) < 100
    settings.COGWORKER = {"REDIS_URL": "embedded", "EMBEDDED_DIR": str(directory), "NAMESPACE": "emb"}
    pid_file = directory / "redis.pid"
    try:
        yield directory
    finally:
        connection.reset()
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        embedded.stop(str(directory))
        if pid is not None and pid_alive(pid):
            try:
                wait_for(lambda: not pid_alive(pid), 5, "the embedded server to exit")
            finally:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


def server_pid(client: Any) -> int:
    return int(client.info("server")["process_id"])


def test_get_redis_starts_a_server_on_a_unix_socket_with_appendonly(embedded_dir):
    socket_path = str(embedded_dir / "redis.sock")
    assert not embedded.is_running(str(embedded_dir))

    client = get_redis()
    assert client.connection_pool.connection_kwargs["path"] == socket_path
    assert client.ping() is True
    assert Path(socket_path).is_socket()
    config = client.config_get("*")
    assert config["appendonly"] == "yes"
    assert config["unixsocket"] == socket_path
    assert config["port"] == "0"  # no TCP listener
    assert Path(config["dir"]) == embedded_dir
    pid = server_pid(client)
    assert int((embedded_dir / "redis.pid").read_text()) == pid

    jid = jobs.record.delay("through the embedded server")
    [raw] = client.lrange("emb:queue:default", 0, -1)
    assert json.loads(raw)["jid"] == jid
    assert (embedded_dir / config["appendfilename"]).exists() or (embedded_dir / "appendonlydir").is_dir()


def test_a_second_call_reuses_the_running_server(embedded_dir):
    first = get_redis()
    assert get_redis() is first
    pid = server_pid(first)
    run_id = first.info("server")["run_id"]
    first.set("emb:marker", "kept")

    connection.reset()  # as a new process would: a new client, the same server
    second = get_redis()
    assert second is not first
    assert (server_pid(second), second.info("server")["run_id"]) == (pid, run_id)
    assert second.get("emb:marker") == b"kept"
    assert embedded.ensure_running(str(embedded_dir)) == str(embedded_dir / "redis.sock")
    assert second.info("server")["run_id"] == run_id


def test_stop_shuts_the_server_down(embedded_dir):
    pid = server_pid(get_redis())
    connection.reset()
    assert embedded.stop(str(embedded_dir)) is True
    assert not embedded.is_running(str(embedded_dir))
    wait_for(lambda: not pid_alive(pid), 10, "the server process to exit")
    assert embedded.stop(str(embedded_dir)) is False


def test_data_survives_a_restart_through_the_append_only_file(embedded_dir):
    client = get_redis()
    client.rpush("emb:queue:default", b"payload")
    connection.reset()
    assert embedded.stop(str(embedded_dir)) is True
    assert get_redis().lrange("emb:queue:default", 0, -1) == [b"payload"]


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("cogworker_embedded", *args, stdout=out)
    return out.getvalue().strip()


def test_the_management_command_starts_reports_and_stops(embedded_dir):
    directory = str(embedded_dir)
    assert command("status") == f"embedded Redis not running ({directory})"
    assert command("start") == f"embedded Redis running on unix://{directory}/redis.sock"
    assert embedded.is_running(directory)
    assert command("status") == f"embedded Redis running ({directory})"
    assert command("stop") == "embedded Redis stopped"
    assert not embedded.is_running(directory)
    assert command("stop") == "embedded Redis was not running"


def test_manage_py_cogworker_embedded_in_a_real_process(embedded_dir):
    get_redis().ping()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "COGWORKER_REDIS_URL": "embedded",
        "COGWORKER_OVERRIDES": json.dumps({"EMBEDDED_DIR": str(embedded_dir)}),
        "PYTHONPATH": str(ROOT),
    }

    def manage(action: str) -> str:
        done = subprocess.run(
            [sys.executable, str(MANAGE), "cogworker_embedded", action],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert manage("status") == f"embedded Redis running ({embedded_dir})"
    connection.reset()
    assert manage("stop") == "embedded Redis stopped"
    assert not embedded.is_running(str(embedded_dir))
