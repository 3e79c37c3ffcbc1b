"""``--reload``: restart the workers when Python code changes (development).

Duty: watch the project's Python files with Django's autoreloader, the one
``runserver`` uses (``StatReloader``, or Watchman when it is installed),
and tell the supervisor when one changes. The supervisor then stops its
workers as SIGTERM does (running jobs finish, or go back to their queue)
and starts new ones, which import the new code: a job added to ``jobs.py``
is registered without a manual restart.

Runserver reloads by exiting its own process; a worker cannot: its running
jobs would be cut off and wait for orphan recovery. So the watching runs
in the supervisor, which holds no job, and the workers are its children.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django_cogworker import threads

logger = logging.getLogger("django_cogworker")

#: What a change to restarts the workers for. Templates and translations
#: are read by Django's own receivers; a job's code is Python.
RELOAD_SUFFIXES = (".py",)


def watch_code(on_change: Callable[[Path], None]) -> None:
    """Calls ``on_change(path)`` from a daemon thread for every changed
    Python file of the modules this process has imported (the settings,
    the apps, their ``jobs`` and ``tasks`` modules and what they import)."""
    from django.utils import autoreload

    reloader = autoreload.get_reloader()

    def changed(sender: Any, file_path: Path, **kwargs: Any) -> bool:
        if Path(file_path).suffix in RELOAD_SUFFIXES:
            on_change(Path(file_path))
        # Handled: Django's default for an unhandled change is sys.exit(3),
        # which is how runserver restarts itself, not how we do.
        return True

    autoreload.file_changed.connect(changed, weak=False, dispatch_uid="django_cogworker.reload")
    autoreload.autoreload_started.send(sender=reloader)
    logger.info("reload: watching Python files for changes with %s", type(reloader).__name__)

    def run() -> None:
        ticker = reloader.tick()
        while True:
            next(ticker)

    threads.start("cogworker-reload", run, None)
