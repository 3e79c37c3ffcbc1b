"""The worker's logging: safe lines, and a voice when the project gives none.

Every line goes through the logger ``django_cogworker``. Two duties:

- :class:`OneLine` keeps a value read from Redis (a jid, a job name, an
  error message) from forging or hiding log lines: what
  ``escaping.one_line`` escapes (C0 and C1 controls, bidi overrides, lone
  surrogates) is written escaped in a record's arguments, so a jid holding
  a newline stays on its line, and a strict UTF-8 handler can write every
  line; a traceback (a failed job's, whose message may quote its
  arguments) is written indented under its record, each line escaped. It
  sits on the logger, so it applies whatever handlers the project
  configures.
- :func:`configure` gives ``manage.py cogworker`` a handler on stderr when
  the project configures none for ``django_cogworker`` (nor for the root
  logger): a worker that prints nothing looks broken. ``-v`` picks the
  level. A project with its own logging stays in charge; an explicit ``-v``
  only sets the logger's level then.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

from django_cogworker.escaping import one_line

LOGGER_NAME = "django_cogworker"

#: ``-v`` 0..3 -> the level of the ``django_cogworker`` logger. 3 also
#: turns on DEBUG for every other library (redis, django.db, ...).
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

#: The default handler's format: one line per record, the pid first
#: (several processes under --processes write to one terminal).
DEFAULT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(message)s"

#: The Tasks framework's loggers (Django's; the django-tasks backport's):
#: its signal receivers write a line per state of a task.
TASKS_LOGGERS = ("django.tasks", "django_tasks")

#: ``-v`` -> their level in a worker: a step quieter than the worker's own
#: lines, which already say when a task finished or failed.
TASKS_VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}

#: What starts each line of a traceback in the log.
TRACEBACK_INDENT = "    "


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, bytes | bytearray):
        return repr(bytes(value))
    if isinstance(value, BaseException):
        return one_line(str(value))
    return value


class OneLine(logging.Filter):
    """Escapes what could forge or hide a line in a record's arguments.
    The format string is ours (a thread dump's newlines stay). A traceback
    is formatted here, every line indented and escaped, so no line of it
    can pass for a record of its own; handlers use it as formatted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text = "\n".join(TRACEBACK_INDENT + one_line(line) for line in text.splitlines())
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_safe(a) for a in args)
        elif isinstance(args, dict):
            record.args = {k: _safe(v) for k, v in args.items()}
        return True


_FILTER = OneLine()


def install_filter() -> None:
    """Idempotent: called when the app is ready."""
    logger = logging.getLogger(LOGGER_NAME)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


def configure(verbosity: int | None) -> logging.Handler | None:
    """Sets up the worker's logging; ``verbosity`` is ``-v`` (None when
    not given). Returns the handler it installed, if any."""
    install_filter()
    logger = logging.getLogger(LOGGER_NAME)
    level = VERBOSITY_LEVELS[1 if verbosity is None else min(max(verbosity, 0), 3)]
    if logger.hasHandlers():  # the project's LOGGING reaches this logger
        if verbosity is not None:
            logger.setLevel(level)
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(DEFAULT_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    if verbosity is not None and verbosity >= 3:
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
        logger.propagate = False  # one line per record, not two
    for name in TASKS_LOGGERS:
        _adopt(logging.getLogger(name), handler, verbosity)
    return handler


def _adopt(other: logging.Logger, handler: logging.Handler, verbosity: int | None) -> None:
    """Prints ``other``'s records with the worker's handler, unless the
    project gives it handlers of its own: a bare ``Task id=... state=FAILED``
    and a traceback from Python's last resort read like nobody's line.
    Propagation stops only where an ancestor would print the same line to
    the terminal again (Django's default ``console``, in DEBUG); a handler
    that mails or ships it (``mail_admins``) still gets it otherwise."""
    if other.handlers:
        return
    other.addHandler(handler)
    other.setLevel(TASKS_VERBOSITY_LEVELS[1 if verbosity is None else min(max(verbosity, 0), 3)])
    probe = logging.LogRecord(other.name, logging.ERROR, __file__, 0, "", None, None)
    ancestor = other.parent
    while ancestor is not None:
        for h in ancestor.handlers:
            if type(h) is logging.StreamHandler and h.filter(probe):
                other.propagate = False
                return
        ancestor = ancestor.parent if ancestor.propagate else None
