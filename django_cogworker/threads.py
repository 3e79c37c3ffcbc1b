"""Starting threads: named, and a crash is logged, never silently lost.

A thread started with ``on_crash`` hands its crash to that callback (which
stops the process, or replaces the thread); one without re-raises, for
Python's own thread exception hook.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

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
