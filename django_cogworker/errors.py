"""Exceptions: one base class, configuration errors are ImproperlyConfigured.

Also the one translation of redis-py's errors into ours, used wherever our
code meets Redis on behalf of a caller (the inspection API, the enqueue
side): :func:`redis_boundary` (a context manager and decorator) and
:func:`translate` (for an ``except`` clause of one's own). A caller catches
:class:`CogworkerError`, never redis-py's classes; the original error stays
attached as ``__cause__``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis
from django.core.exceptions import ImproperlyConfigured


class CogworkerError(Exception):
    """Base class of every error django-cogworker raises on purpose."""


class ConfigurationError(CogworkerError, ImproperlyConfigured):
    """The ``COGWORKER`` settings are wrong; the message names the key."""


class RedisUnavailable(CogworkerError):
    """Redis could not be reached (wraps redis-py's connection errors)."""


class RedisRefused(CogworkerError):
    """Redis answered a command with an error (out of memory under
    maxmemory, a read-only replica, a key of the wrong type, a lost script);
    the message gives the server's reason."""


class EnqueueRefused(RedisRefused):
    """Redis answered but refused to store a job (out of memory, read-only, ...)."""


class UnsupportedServer(CogworkerError):
    """The Redis server lacks a command reliable fetch needs (BLMOVE, LPOS)."""


class JobNotRegistered(CogworkerError):
    """A payload names a job that no ``@job`` registered."""


class BadPayload(CogworkerError):
    """A payload that cannot be run: not JSON, not an object, or misshapen."""


class ProcessDied(CogworkerError):
    """Filed in dead for a job whose process died under it too many times."""


def translate(
    exc: redis.RedisError, doing: str, *, refused: type[RedisRefused] = RedisRefused
) -> CogworkerError:
    """Our error for a redis-py error met while trying to ``doing`` ("enqueue",
    "read the dead set"): :class:`RedisUnavailable` for a connection error or
    a timeout, ``refused`` (by default :class:`RedisRefused`) for any other
    answer Redis gave. The message keeps redis-py's text, which names the
    host and port (or socket path) and never the password. Raise it with
    ``raise translate(exc, doing) from exc``."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return RedisUnavailable(f"could not {doing}: Redis is unreachable ({exc})")
    return refused(f"could not {doing}: Redis refused it ({exc})")


@contextlib.contextmanager
def redis_boundary(doing: str, *, refused: type[RedisRefused] = RedisRefused) -> Iterator[None]:
    """Raises redis-py's errors from the block (or the decorated function)
    as ours, through :func:`translate`, ``from`` the original::

        with redis_boundary("enqueue", refused=EnqueueRefused):
            pipe.execute()

        @redis_boundary("read the queues")
        def all(cls) -> list[Queue]: ...

    A generator must use it inside its body: decorating one covers only its
    creation, not the iteration."""
    try:
        yield
    except redis.RedisError as exc:
        raise translate(exc, doing, refused=refused) from exc
