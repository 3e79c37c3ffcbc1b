"""``--processes N``: a supervisor of N worker processes.

Each child is a full ``cogworker`` command with its own identity. A child
that dies is restarted (after a short pause, so a crash loop does not spin);
TERM/INT/TSTP/TTIN are forwarded to every child, and the supervisor exits
once every child has.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

logger = logging.getLogger("django_cogworker")

RESTART_PAUSE_S = 1.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGTTIN)


class Supervisor:
    def __init__(self, processes: int, child_args: list[str]) -> None:
        self.processes = processes
        self.child_args = child_args
        self.children: list[subprocess.Popen[bytes] | None] = [None] * processes
        self.stopping = False

    def command(self) -> list[str]:
        return [sys.executable, "-m", "django", "cogworker", *self.child_args]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Children start with `python -m django`: give them the importable
        # path the parent had (the project root of manage.py).
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys([*paths, *env.get("PYTHONPATH", "").split(os.pathsep)])
        )
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", ""))
        return env

    def spawn(self, index: int) -> None:
        child = subprocess.Popen(self.command(), env=self.env())
        self.children[index] = child
        logger.info("supervisor: started worker %d (pid %d)", index, child.pid)

    def forward(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        for child in self.children:
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def run(self) -> int:
        for signum in FORWARDED:
            signal.signal(signum, self.forward)
        for index in range(self.processes):
            self.spawn(index)
        while True:
            alive = 0
            for index, child in enumerate(self.children):
                if child is None:
                    continue
                code = child.poll()
                if code is None:
                    alive += 1
                elif not self.stopping:
                    logger.warning(
                        "supervisor: worker %d (pid %d) exited with %s; restarting", index, child.pid, code
                    )
                    time.sleep(RESTART_PAUSE_S)
                    self.spawn(index)
                    alive += 1
            if self.stopping and alive == 0:
                return 0
            time.sleep(0.2)
