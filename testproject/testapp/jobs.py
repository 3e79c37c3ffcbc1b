"""Jobs the test suite runs in real worker processes.

Each records what happened in Redis under the test's own namespace, so a
test can see every run, in any process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from django_cogworker import current_job, job
from django_cogworker.conf import get_config
from django_cogworker.connection import get_redis


def _note(kind: str, **extra: object) -> None:
    ctx = current_job()
    entry = {"jid": ctx.jid if ctx else None, "pid": os.getpid(), "at": time.time(), **extra}
    if ctx is not None:
        entry.update(queue=ctx.queue, retry_count=ctx.retry_count, name=ctx.name)
    get_redis().rpush(f"{get_config().namespace}:test:{kind}", json.dumps(entry))


@job
def record(tag: object = None) -> None:
    _note("runs", tag=tag)


@job(queue="mail")
def record_mail(tag: object = None) -> None:
    _note("runs", tag=tag)


@job
def sleep_then_record(seconds: float, tag: object = None) -> None:
    _note("started", tag=tag)
    time.sleep(seconds)
    _note("runs", tag=tag)


@job(retry=2, retry_in=lambda count, exc: 0.1)
def fail(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


@job(retry=0, dead=False)
def fail_and_drop(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


def exhausted(payload: dict, exc: BaseException) -> None:
    get_redis().rpush(f"{get_config().namespace}:test:exhausted", json.dumps(payload))


@job(retry=1, retry_in=lambda count, exc: 0.1, on_exhausted=exhausted)
def fail_with_hook(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise RuntimeError(message)


@job(retry=5)
def kill_own_process() -> None:
    """A poison pill: its process dies under it (as with the OOM killer)."""
    _note("runs", tag="kill")
    os.kill(os.getpid(), signal.SIGKILL)


def error_handler(exc: BaseException, context: dict) -> None:
    get_redis().rpush(
        f"{get_config().namespace}:test:errors",
        json.dumps({"error": type(exc).__name__, "jid": context.get("jid"), "job": context.get("job")}),
    )


@job
def noop() -> None:
    """Does nothing: used to measure the worker's own cost per job."""


# -- what a job gets of the machine (tests/test_affinity.py, G21) ---------------------------


def scheduling_now() -> dict[str, object]:
    """The CPUs the calling thread may run on, its scheduling policy and its niceness."""
    return {"cpus": sorted(os.sched_getaffinity(0)), "policy": os.sched_getscheduler(0), "nice": os.nice(0)}


_SCHEDULING_OF_A_SUBPROCESS = (
    "import json, os; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
    "'policy': os.sched_getscheduler(0), 'nice': os.nice(0)}))"
)


@job
def scheduling(tag: object = None) -> None:
    """Notes :func:`scheduling_now` of its own thread, of a thread pool's
    thread and of a subprocess it starts, as an image or ML job would."""
    with ThreadPoolExecutor(1) as pool:
        pooled = pool.submit(scheduling_now).result(60)
    command = [sys.executable, "-c", _SCHEDULING_OF_A_SUBPROCESS]
    child = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    _note("runs", tag=tag, job=scheduling_now(), pooled=pooled, subprocess=json.loads(child.stdout))


# -- jobs of the guarantee and chaos tests (tests/test_guarantees.py, tests/test_chaos.py) --


@job
def block_first_run(seconds: float, tag: object = None) -> None:
    """Sleeps on its first run only (per jid), so that a test can kill the
    process holding it; any later run (after a recovery) is quick."""
    ctx = current_job()
    first = get_redis().set(f"{get_config().namespace}:test:first:{ctx.jid if ctx else ''}", 1, nx=True)
    if first:
        _note("started", tag=tag)
        time.sleep(seconds)
    _note("runs", tag=tag)


@job(retry_in=lambda count, exc: 0.2)
def pace(seconds: float, tag: object = None) -> None:
    """Takes ``seconds``; retried after 0.2 s if it fails (say, Redis went away
    under it), so that a test of outages stays short."""
    time.sleep(seconds)
    _note("runs", tag=tag)


@job(retry=0)
def fail_no_retry(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


class JobAborted(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


@job(retry=0)
def raise_base_exception(kind: str) -> None:
    _note("runs", tag=kind)
    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    raise JobAborted(kind)


@job
def db_close_probe(close_in_s: float, tag: object = None) -> None:
    """Opens this thread's database connection and marks it obsolete in
    ``close_in_s`` (as CONN_MAX_AGE would), noting under ``closed`` (with the
    jid of the job then current) each time Django's ``close_old_connections``
    closes it: so a test sees whether it runs before and after each job."""
    from django.db import connection

    if not getattr(connection, "_probe_installed", False):
        original_close = connection.close

        def close() -> None:
            _note("closed")
            original_close()

        connection.close = close
        connection._probe_installed = True
    _note("runs", tag=tag, had_connection=connection.connection is not None)
    connection.ensure_connection()
    connection.close_at = time.monotonic() + close_in_s


@job(retry=1, retry_in=lambda count, exc: 0.1)
def wait_for_go(tag: object = None, timeout_s: float = 30.0) -> None:
    """Notes its start, then waits until ``test:go:<pid>`` is set for this
    process (so a test decides when each process's run ends); fails, after
    that, in a process for which ``test:fail:<pid>`` is set."""
    _note("started", tag=tag)
    namespace, pid = get_config().namespace, os.getpid()
    deadline = time.monotonic() + timeout_s
    while not get_redis().exists(f"{namespace}:test:go:{pid}"):
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.02)
    _note("runs", tag=tag)
    if get_redis().exists(f"{namespace}:test:fail:{pid}"):
        raise ValueError("failed after going on")


@job(retry_in=lambda count, exc: 0.2)
def noted_pace(seconds: float, tag: object = None) -> None:
    """As ``pace``, but notes its start too: a test can then tell which
    jobs were running (started, not finished) in a process it killed."""
    _note("started", tag=tag)
    time.sleep(seconds)
    _note("runs", tag=tag)


@job(retry=0)
def note_to_file(path: str, tag: object, padding: str = "", first_run_s: float = 0.0) -> None:
    """Appends ``tag`` to the file ``path``, one line per run: a record kept
    outside Redis, for a test whose Redis is full (a note in Redis would be
    refused). ``padding`` only makes the payload as large as the test needs;
    ``first_run_s``: the first run (per tag, marked by a file beside
    ``path``) takes that long first, so that a test can kill its process."""
    marker = f"{path}.started.{tag}"
    if first_run_s and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(first_run_s)
    with open(path, "a") as fh:
        fh.write(f"{tag}\n")


@job(retry=0)
def write_loaded_modules(path: str) -> None:
    """Writes the names in the worker's ``sys.modules`` to ``path`` (JSON):
    what a worker has loaded by the time it runs this. Written to a side
    file and renamed, so a reader waiting for ``path`` never reads half."""
    with open(path + ".part", "w") as fh:
        json.dump(sorted(sys.modules), fh)
    os.replace(path + ".part", path)


@job(timeout=1.0, retry=False)
def busy_past_timeout(tag: object = None) -> None:
    """A pure-Python busy loop inside ``except Exception``: only a
    ``JobTimeout`` (a BaseException) gets it out before 30 s."""
    ctx = current_job()
    assert ctx is not None
    first = ctx.remaining()
    spin_until = time.monotonic() + 0.2
    while time.monotonic() < spin_until:
        pass
    _note("remaining", tag=tag, first=first, later=ctx.remaining())
    try:
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            pass
    except Exception:
        _note("swallowed", tag=tag)
    _note("overran", tag=tag)


@job(timeout=0.002, retry=False)
def spin_about_timeout(seconds: float) -> None:
    """Spins for ``seconds``, around its timeout: some finish just before
    the deadline, some at it, some long after."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass


@job(hard_timeout=1.0, retry=False)
def stuck_in_sleep(tag: object = None) -> None:
    _note("runs", tag=tag)
    time.sleep(60)


@job(hard_timeout=1.0, retry=False)
def stuck_in_recv(tag: object = None) -> None:
    """Blocked in a C call, a socket read without a timeout, for ever."""
    _note("runs", tag=tag)
    waiting, _silent = socket.socketpair()
    waiting.recv(1)


@job(hard_timeout=1.0, retry=1)
def stuck_in_sleep_retried(tag: object = None) -> None:
    _note("runs", tag=tag)
    time.sleep(60)


@job(expires=1)
def expiring(tag: object = None) -> None:
    _note("runs", tag=tag)


@job(expires=1, unique_for=600)
def expiring_unique(tag: object = None) -> None:
    _note("runs", tag=tag)


@job(expires=3, retry=5, retry_in=lambda count, exc: 30)
def expiring_fail(message: str = "boom") -> None:
    _note("runs", tag=message)
    raise ValueError(message)


from testproject.testapp import batch_jobs as batch_jobs  # noqa: E402  (registers them)
from testproject.testapp import limited_jobs as limited_jobs  # noqa: E402  (registers them)

if os.environ.get("COGWORKER_TEST_ASYNC_JOBS"):
    # A worker of tests/test_async_jobs.py: registers the async jobs too.
    from testproject.testapp import async_jobs  # noqa: F401

from testproject.testapp import workflow_jobs as workflow_jobs  # noqa: E402  (registers them)
