"""The child side of ``--processes N``: stop once the supervisor is gone (G20).

Duty: a worker started by a supervisor (``supervisor.py``) stops as on
SIGTERM once its supervisor has died, even SIGKILLed, instead of working on
beside the supervisor's successor. The supervisor holds the write end of one
pipe, never written to; every child gets the read end, and a thread of the
child blocks reading it. When the supervisor dies, the kernel closes the
write end and the read returns EOF.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable

from django_cogworker import threads

logger = logging.getLogger("django_cogworker")

#: Environment variables that give a child the read end of the supervisor's
#: pipe and the supervisor's pid.
SUPERVISOR_FD_ENV = "COGWORKER_SUPERVISOR_FD"
SUPERVISOR_PID_ENV = "COGWORKER_SUPERVISOR_PID"


def watch_supervisor(
    on_gone: Callable[[], None], on_crash: Callable[[str], None] | None = None
) -> threading.Thread | None:
    """In a child of a supervisor: call ``on_gone`` once the supervisor has
    died, however it died. Returns the watching thread, or None when this
    process has no supervisor."""
    value = os.environ.pop(SUPERVISOR_FD_ENV, None)
    # Popped, not read: a subprocess a job starts is no child of the supervisor.
    pid = os.environ.pop(SUPERVISOR_PID_ENV, "?")
    if value is None:
        return None
    try:
        fd = int(value)
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except (ValueError, OSError):
        is_pipe = False
    if not is_pipe:
        logger.error("%s=%r is not a pipe; cannot watch the supervisor", SUPERVISOR_FD_ENV, value)
        return None
    os.set_inheritable(fd, False)

    def watch() -> None:
        # Nothing is ever written: the read returns only at EOF, when the
        # last write end (the supervisor's) is closed.
        while os.read(fd, 512):
            pass
        os.close(fd)
        logger.warning("supervisor (pid %s) is gone; stopping", pid)
        on_gone()

    return threads.start("cogworker-supervisor-watch", watch, on_crash)
