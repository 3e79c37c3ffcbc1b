"""The worker's logging: safe lines, and a voice when the project gives none.

Every line goes through the logger ``django_cogworker``. Two duties:

- :class:`OneLine` keeps a value read from Redis (a jid, a job name, an
  error message) from forging or hiding log lines: what
  ``escaping.one_line`` escapes (C0 and C1 controls, bidi overrides, lone
  surrogates) is written escaped in a record's arguments, so a jid holding
  a newline stays on its line, and a strict UTF-8 handler can write every
  line. It sits on the logger, so it applies whatever handlers the project
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
from typing import Any

from django_cogworker.escaping import one_line

LOGGER_NAME = "django_cogworker"

#: ``-v`` 0..3 -> the level of the ``django_cogworker`` logger. 3 also
#: turns on DEBUG for every other library (redis, django.db, ...).
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

#: The default handler's format: one line per record, the pid first
#: (several processes under --processes write to one terminal).
DEFAULT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(message)s"


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
    The format string is ours (a thread dump's newlines stay); tracebacks
    are ``exc_info``, formatted by the handler, untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
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
    return handler
