"""Starting threads: named, and a crash is logged, never silently lost.

A thread started with ``on_crash`` hands its crash to that callback (which
stops the process, or replaces the thread); one without re-raises, for
Python's own thread exception hook. :func:`dump` logs every thread's stack
(SIGTTIN), to see where a stuck process is.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_cogworker")


def start(
    name: str, target: Callable[[], None], on_crash: Callable[[str], None] | None = None
) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException:
            logger.exception("thread %s crashed", name)
            if on_crash is None:
                raise
            on_crash(name)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def dump() -> None:
    names = {t.ident: t.name for t in threading.enumerate()}
    frames: Any = sys._current_frames()
    for ident, frame in frames.items():
        stack = "".join(traceback.format_stack(frame))
        logger.warning("thread %s (%s):\n%s", names.get(ident, "?"), ident, stack)
