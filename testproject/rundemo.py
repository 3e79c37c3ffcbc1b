#!/usr/bin/env python
"""Run the demo: a Redis server if none is given, the web site and a worker.

``python testproject/rundemo.py`` (``make demo`` runs it in the project's virtual
environment). With ``COGWORKER_REDIS_URL`` unset it starts the embedded Redis
server and stops it again at the end. It migrates the SQLite database, makes
sure the superuser ``admin`` / ``admin`` exists, puts one scheduled job (so
that the admin's Scheduled page has something to show), starts ``runserver``
and ``cogworker --reload``, and waits for Ctrl-C, SIGTERM, or either of them
to exit; then it stops both (SIGTERM, then SIGKILL after a grace period).

Every command runs with the demo's settings, ``testproject.demo.settings``:
the test project's, without the test suite's jobs and with a periodic entry.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent
MANAGE = [sys.executable, str(PROJECT_DIR / "manage.py")]
SETTINGS_MODULE = "testproject.demo.settings"

HOST, PORT = "127.0.0.1", 8000
URL = f"http://{HOST}:{PORT}/"
ADMIN_USER = ADMIN_PASSWORD = "admin"

SETUP_TIMEOUT = 120.0  # one management command (migrate, embedded start/stop, ...)
STOP_TIMEOUT = 30.0  # SIGTERM to SIGKILL; the worker needs SHUTDOWN_TIMEOUT (25 s)
STARTUP_WAIT = 30.0  # for the web server to accept connections
SCHEDULED_AT_START = 120  # seconds ahead of the job put in the scheduled set at start

ENSURE_ADMIN = f"""
from django.contrib.auth import get_user_model
User = get_user_model()
user, created = User.objects.get_or_create(username={ADMIN_USER!r})
user.is_staff = user.is_superuser = user.is_active = True
user.set_password({ADMIN_PASSWORD!r})
user.save()
print("[demo] superuser 'admin' " + ("created" if created else "exists: password reset to 'admin'"))
"""

# Redis not answering is only a warning here: the worker and the site say more.
SCHEDULE_ONE = f"""
import redis
from django_cogworker.errors import CogworkerError
from testproject.demo.views import schedule_note
try:
    jid = schedule_note({SCHEDULED_AT_START})
except (CogworkerError, redis.RedisError) as exc:
    print(f"[demo] could not put a scheduled job: {{exc}}")
else:
    print(f"[demo] scheduled job {{jid}}: due in {SCHEDULED_AT_START} s (admin: Scheduled)")
"""


class Stop(Exception):
    """Ctrl-C or SIGTERM arrived."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def manage(*args: str, timeout: float = SETUP_TIMEOUT) -> str:
    """Run one management command to its end; its output is shown and returned."""
    result = subprocess.run(
        [*MANAGE, *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.stdout.strip():
        print(result.stdout.rstrip(), flush=True)
    if result.returncode:
        raise SystemExit(f"[demo] manage.py {' '.join(args)} failed (exit status {result.returncode})")
    return result.stdout


def embedded_redis_running() -> bool:
    out = subprocess.run(
        [*MANAGE, "cogworker_embedded", "status"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT,
        check=False,
    ).stdout
    return "running" in out and "not running" not in out


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None
PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """Runs in each long-lived child between fork and exec."""
    # Own process group: Ctrl-C reaches the launcher only, which then stops
    # each child exactly once with SIGTERM.
    os.setpgid(0, 0)
    # Should the launcher itself be killed, its children get SIGTERM (Linux).
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start(name: str, *args: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([*MANAGE, *args], cwd=REPO_ROOT, preexec_fn=_child_setup)
    log(f"started {name} (pid {process.pid})")
    return process


def wait_or_kill(name: str, process: subprocess.Popen[bytes], deadline: float) -> None:
    """Wait for a child told to stop (SIGTERM) until ``deadline``, then SIGKILL it.

    Exiting 0 or by that SIGTERM is a normal stop (``runserver`` has no
    handler: the signal ends it); the SIGKILL sent here is reported as such;
    any other status is reported as it is."""
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop within {STOP_TIMEOUT:.0f} s: SIGKILL")
        process.kill()
        process.wait(timeout=10)
        if process.returncode == -signal.SIGKILL:
            log(f"{name} killed")
            return
    if process.returncode in (0, -signal.SIGTERM):
        log(f"{name} stopped")
    else:
        log(f"{name} exited with status {process.returncode}")


def wait_for_port(host: str, port: int, timeout: float, *watch: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in watch):
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def main() -> int:
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    # Inherited by every command run from here on.
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    embedded = not os.environ.get("COGWORKER_REDIS_URL")
    embedded_started = False
    children: dict[str, subprocess.Popen[bytes]] = {}
    exited: set[str] = set()  # children that stopped by themselves, already reported
    status = 0
    try:
        if embedded and embedded_redis_running():
            log("COGWORKER_REDIS_URL is not set: using the embedded Redis server already running")
        elif embedded:
            log("COGWORKER_REDIS_URL is not set: starting the embedded Redis server")
            embedded_started = True  # set first: an interrupted start is cleaned up too
            manage("cogworker_embedded", "start")
        else:
            log(f"Redis: {os.environ['COGWORKER_REDIS_URL']}")
        manage("migrate", "--noinput", "--verbosity", "1")
        manage("shell", "--no-imports", "--command", ENSURE_ADMIN + SCHEDULE_ONE)
        log("the worker restarts when a Python file changes (cogworker --reload)")
        children["web server"] = start("web server", "runserver", f"{HOST}:{PORT}", "--noreload")
        children["worker"] = start("worker", "cogworker", "--reload")
        if not wait_for_port(HOST, PORT, STARTUP_WAIT, *children.values()):
            log(f"the web server is not answering on {HOST}:{PORT} yet")
        log(f"demo site: {URL}   admin: {URL}admin/   login: {ADMIN_USER} / {ADMIN_PASSWORD}")
        log("press Ctrl-C to stop")
        while True:
            for name, process in children.items():
                if process.poll() is not None:
                    log(f"{name} exited with status {process.returncode}")
                    exited.add(name)
                    status = 1
                    raise Stop(name)
            time.sleep(0.5)
    except Stop:
        pass
    except subprocess.TimeoutExpired as exc:
        log(f"gave up waiting: {exc}")
        status = 1
    except SystemExit as exc:
        print(exc, file=sys.stderr, flush=True)
        status = 1
    finally:
        # Further Ctrl-C would only interrupt the clean-up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        deadline = time.monotonic() + STOP_TIMEOUT
        stopping: dict[str, subprocess.Popen[bytes]] = {}
        for name, process in children.items():
            if process.poll() is None:
                log(f"stopping {name} (pid {process.pid})")
                process.send_signal(signal.SIGTERM)
                stopping[name] = process
            elif name not in exited:  # exited by itself meanwhile, not reported yet
                log(f"{name} exited with status {process.returncode}")
                status = status or 1
        for name, process in stopping.items():
            wait_or_kill(name, process, deadline)
        if embedded_started:
            log("stopping the embedded Redis server")
            try:
                manage("cogworker_embedded", "stop")
            except (SystemExit, subprocess.TimeoutExpired) as exc:
                log(f"could not stop the embedded Redis server: {exc}")
                status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
