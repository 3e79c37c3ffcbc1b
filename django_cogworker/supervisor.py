"""``--processes N``: a supervisor of N worker processes (G20).

Duties of the supervisor: start N children, each a full ``cogworker``
command with its own identity; replace a child that dies (after
``RESTART_PAUSE_S``, so a crash loop does not spin), unless it is stopping
or quiet; on TERM/INT send SIGTERM to every child alive while it stops, the
ones spawned in a race included, and exit 0 once every child has exited;
SIGKILL a child still alive ``KILL_MARGIN_S`` after its ``SHUTDOWN_TIMEOUT``
(orphan recovery then returns its jobs); forward TSTP/TTIN to every live
child; give each child its CPU (``affinity.py``). Under ``--reload``
(``reloader.py``), restart every child when a Python file changes: SIGTERM,
as for a stop, and a new child as soon as the old one has exited.

The signal handlers only record the signal. The main loop does all the work
and never sleeps blindly: it waits on the signal module's wakeup fd, so it
wakes at once for a signal or a child's death (no race in which a stop
during the restart pause spawns a child that never gets SIGTERM).

The child side, which stops a child once its supervisor is gone, is
``supervisor_watch.py``: the supervisor holds the write end of one pipe,
never written to, and every child gets the read end. On Linux,
``PR_SET_PDEATHSIG`` sends the child SIGTERM as well, a second line of
defence.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django_cogworker import affinity
from django_cogworker.process import BACKGROUND_STOP_TIMEOUT_S
from django_cogworker.supervisor_watch import SUPERVISOR_FD_ENV, SUPERVISOR_PID_ENV

logger = logging.getLogger("django_cogworker")

#: How long after a child died before it is replaced, so that a child that
#: crashes at boot does not spin.
RESTART_PAUSE_S = 1.0

#: How long after SHUTDOWN_TIMEOUT a child sent SIGTERM may take to exit before
#: it is SIGKILLed: it waits for its background threads, then deregisters.
KILL_MARGIN_S = BACKGROUND_STOP_TIMEOUT_S + 5.0

#: The longest the main loop waits without looking at its children (a safety net).
MAX_WAIT_S = 1.0

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
FORWARDED = (signal.SIGTSTP, signal.SIGTTIN)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

#: Put in the queue of received signals by the reload watcher.
RELOAD = -1


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes]
    #: Monotonic time at which it was sent SIGTERM, if it was.
    terminated_at: float | None = None
    killed: bool = False
    #: Sent SIGTERM because code changed: restart it at once.
    reloading: bool = False


class Supervisor:
    def __init__(
        self,
        cpus: affinity.Plan,
        child_args: list[str],
        shutdown_timeout_s: float,
        *,
        reload: bool = False,
        each: list[list[str]] | None = None,
    ) -> None:
        self.cpus = cpus  # one per child: its CPU, or None
        self.reload = reload
        self.child_args = child_args
        #: Each child's own arguments after the shared ones: under SHARDING,
        #: its queue group's queues and threads (``shards.split``).
        self.each = each if each is not None else [[] for _ in cpus]
        self.kill_after_s = shutdown_timeout_s + KILL_MARGIN_S
        self.children: list[Child | None] = [None] * len(cpus)
        #: Slot index -> monotonic time at which to (re)start its child.
        self.start_at: dict[int, float] = {}
        self.received: collections.deque[int] = collections.deque()
        self.stopping = False
        self.quiet = False
        self.changed: Path | None = None
        self.prctl = _load_prctl()

    def command(self, index: int = 0) -> list[str]:
        return [sys.executable, "-m", "django", "cogworker", *self.child_args, *self.each[index]]

    def env(self, watch_fd: int, index: int) -> dict[str, str]:
        env = dict(os.environ)
        # Children start with `python -m django`: give them the importable
        # path the parent had (the project root of manage.py).
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys([*paths, *env.get("PYTHONPATH", "").split(os.pathsep)])
        )
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", ""))
        env[SUPERVISOR_FD_ENV] = str(watch_fd)
        env[SUPERVISOR_PID_ENV] = str(os.getpid())
        env[affinity.CPU_ENV] = "" if self.cpus[index] is None else str(self.cpus[index])
        return env

    def spawn(self, index: int, watch_fd: int) -> None:
        try:
            # close_fds (the default) and os.pipe's non-inheritable fds: a
            # child gets the read end only. A child holding the write end
            # would keep the pipe open after the supervisor died.
            env = self.env(watch_fd, index)
            proc = subprocess.Popen(
                self.command(index), env=env, pass_fds=(watch_fd,), preexec_fn=self.prepare_child
            )
        except OSError as exc:
            logger.error("supervisor: could not start worker %d (%s); retrying", index, exc)
            self.start_at[index] = time.monotonic() + RESTART_PAUSE_S
            return
        self.children[index] = Child(index, proc)
        logger.info("supervisor: started worker %d (pid %d)", index, proc.pid)

    def prepare_child(self) -> None:
        """Runs in the child between fork and exec."""
        # Until the child installs its own handlers, TSTP and TTIN would
        # suspend it, and a suspended child ignores the SIGTERM of a stop.
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_IGN)
        if self.prctl is not None:
            self.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))

    def live(self) -> list[Child]:
        return [child for child in self.children if child is not None]

    # -- the main loop ---------------------------------------------------------------

    def run(self) -> int:
        watch_r, watch_w = os.pipe()  # the write end is never written to: see supervisor_watch.py
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signals = (*STOP_SIGNALS, *FORWARDED, signal.SIGCHLD)
        previous = {signum: signal.signal(signum, self.record) for signum in signals}
        previous_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        if self.reload:
            from django_cogworker.reloader import watch_code

            watch_code(lambda path: self.code_changed(path, wake_w))
        try:
            self.start_at = dict.fromkeys(range(len(self.cpus)), time.monotonic())
            while True:
                self.take_signals()
                self.reap()
                if self.stopping:
                    self.terminate()
                    self.kill_overdue()
                    if not self.live():
                        logger.info("supervisor: every worker has exited")
                        return 0
                else:
                    self.kill_overdue()
                    self.start_due(watch_r)
                self.wait(wake_r)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for fd in (watch_r, watch_w, wake_r, wake_w):
                os.close(fd)

    def record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def code_changed(self, path: Path, wake_fd: int) -> None:
        """From the reload watcher's thread: queue a reload, wake the loop."""
        self.changed = path
        self.received.append(RELOAD)
        with contextlib.suppress(BlockingIOError):  # full: the loop wakes anyway
            os.write(wake_fd, b"r")

    def take_signals(self) -> None:
        while self.received:
            signum = self.received.popleft()
            if signum in STOP_SIGNALS:
                if not self.stopping:
                    logger.info("supervisor: %s; stopping every worker", signal.Signals(signum).name)
                    self.stopping = True
                    self.start_at.clear()
            elif signum == RELOAD:
                self.restart_for_reload()
            elif signum in FORWARDED:
                if signum == signal.SIGTSTP:
                    # A child started from now on would fetch again.
                    self.quiet = True
                    self.start_at.clear()
                for child in self.live():
                    self.send(child, signum)

    def restart_for_reload(self) -> None:
        if self.stopping:
            return
        logger.info("supervisor: %s changed; restarting the workers", self.changed)
        for child in self.live():
            child.reloading = child.reloading or child.terminated_at is None
            self.stop_child(child)
        if not self.quiet:
            # A slot waiting out its restart pause starts with the new code at once.
            self.start_at = dict.fromkeys(self.start_at, time.monotonic())

    def reap(self) -> None:
        now = time.monotonic()
        for child in self.live():
            code = child.proc.poll()
            if code is None:
                continue
            self.children[child.index] = None
            name = f"worker {child.index} (pid {child.proc.pid})"
            # A child killed by our own SIGTERM was still booting, before
            # its handlers: that is a clean stop too, not a crash.
            clean = code == 0 or (child.terminated_at is not None and code == -signal.SIGTERM)
            if child.killed:
                logger.warning("supervisor: %s was killed", name)
            elif self.stopping and clean:
                logger.info("supervisor: %s stopped", name)
            elif child.reloading and not self.stopping and not self.quiet:
                logger.info("supervisor: %s stopped for the reload; starting a new one", name)
                self.start_at[child.index] = now
            elif self.stopping:
                logger.warning("supervisor: %s %s during the stop", name, describe(code))
            elif self.quiet:
                logger.warning("supervisor: %s %s; not restarting it: quiet", name, describe(code))
            else:
                log = logger.info if code == 0 else logger.warning
                log("supervisor: %s %s; restarting it in %.0fs", name, describe(code), RESTART_PAUSE_S)
                self.start_at[child.index] = now + RESTART_PAUSE_S

    def start_due(self, watch_fd: int) -> None:
        now = time.monotonic()
        for index, when in sorted(self.start_at.items()):
            # A stop that arrived since take_signals: spawn nothing more.
            if when <= now and not self.received:
                del self.start_at[index]
                self.spawn(index, watch_fd)

    def terminate(self) -> None:
        for child in self.live():
            self.stop_child(child)

    def stop_child(self, child: Child) -> None:
        if child.terminated_at is None:
            self.send(child, signal.SIGTERM)
            # A child suspended (SIGSTOP, a debugger) would not act on
            # SIGTERM until it is continued.
            self.send(child, signal.SIGCONT)
            child.terminated_at = time.monotonic()

    def kill_overdue(self) -> None:
        now = time.monotonic()
        for child in self.live():
            if child.terminated_at is None or child.killed:
                continue
            if now - child.terminated_at >= self.kill_after_s:
                logger.error(
                    "supervisor: worker %d (pid %d) still running %.0fs after SIGTERM; killing it "
                    "(orphan recovery will return its jobs)",
                    child.index,
                    child.proc.pid,
                    now - child.terminated_at,
                )
                self.send(child, signal.SIGKILL)
                child.killed = True

    def send(self, child: Child, signum: int) -> None:
        # Does nothing once the child is reaped: a recycled pid is never signalled.
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signum)

    def wait(self, wake_fd: int) -> None:
        """Until a signal, a child's death, or the next deadline."""
        now = time.monotonic()
        deadlines = list(self.start_at.values())
        deadlines += [c.terminated_at + self.kill_after_s for c in self.live() if c.terminated_at is not None]
        timeout = min([MAX_WAIT_S, *(d - now for d in deadlines)])
        if self.received:
            timeout = 0.0
        select.select([wake_fd], [], [], max(0.0, timeout))
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_fd, 512):
                pass


def describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _load_prctl() -> Callable[[int, int], int] | None:
    """libc's prctl on Linux, loaded before any fork (not in preexec_fn)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[[int, int], int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl
