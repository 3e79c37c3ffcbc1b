"""Exceptions: one base class, configuration errors are ImproperlyConfigured.

Also the one translation of redis-py's errors into ours, used wherever our
code meets Redis on behalf of a caller (the inspection API, the enqueue
side): :func:`redis_boundary` (a context manager and decorator) and
:func:`translate` (for an ``except`` clause of one's own). A caller catches
:class:`CogworkerError`, never redis-py's classes; the original error stays
attached as ``__cause__``.

A leaf: errors translate, and know no connection. What must react to an
error met at the boundary (the connection drops a demoted master's
connections) registers itself here (:func:`react_with`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from types import TracebackType

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
    the message gives the server's reason. ``full``: the reason is a full
    Redis (:func:`is_full`)."""

    def __init__(self, message: str, *, full: bool = False) -> None:
        super().__init__(message)
        self.full = full


class EnqueueRefused(RedisRefused):
    """Redis answered but refused to store a job (out of memory, a key of the wrong type, ...)."""


class EnqueueNotReplicated(CogworkerError):
    """``ENQUEUE_WAIT_REPLICAS``: the job was pushed on the master, but fewer
    replicas than asked confirmed it within ``ENQUEUE_WAIT_TIMEOUT``; a
    failover now could lose it. The caller decides whether to push again
    (a second push may run the job twice). ``jids`` names the jobs."""

    def __init__(self, message: str, jids: list[str] | None = None) -> None:
        super().__init__(message)
        self.jids = list(jids or [])


class UnsupportedServer(CogworkerError):
    """The Redis server lacks a command reliable fetch needs (BLMOVE, LPOS)."""


class JobNotRegistered(CogworkerError):
    """A payload names a job that no ``@job`` registered."""


class BadPayload(CogworkerError):
    """A payload that cannot be run: not JSON, not an object, or misshapen."""


class BatchNotFound(CogworkerError, LookupError):
    """``api.Batch(bid)``: no batch has this id in Redis: it never existed,
    or it expired (``BATCH_TTL`` open, ``BATCH_DONE_TTL`` settled) or was
    deleted."""


class ProcessDied(CogworkerError):
    """Filed in dead for a job whose process died under it too many times."""


class JobTimeout(BaseException):
    """A job ran past its ``timeout`` (raised in its thread) or its
    ``hard_timeout`` (the error it is filed with). A ``BaseException``, like
    ``KeyboardInterrupt``, so that a job's ``except Exception`` does not
    swallow it; the run is a failure like any other (retry, dead)."""


class OverLimit(BaseException):
    """Raised by ``limiter.acquire()`` in job code when the limiter is full
    (SPEC section 14). Not a failure: the job is parked (or, for a rate,
    waits for the window to have room) and runs again from its start, its
    ``retry_count`` and the failed counter unchanged. A ``BaseException``,
    so that a job's ``except Exception`` does not swallow it."""

    def __init__(self, limiter: object) -> None:
        name = getattr(limiter, "name", limiter)
        super().__init__(f"limiter {name!r} is full; the job waits and runs again from its start")
        #: The full limiter (a ``limits.Limiter``).
        self.limiter = limiter


#: Replies that mean "this is not (or no longer) the master that can take
#: the command": a failover or a cluster resharding under way. They are an
#: outage, like a refused connection, not a failing command.
NOT_THE_MASTER: tuple[type[BaseException], ...] = (
    redis.ReadOnlyError,
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # MOVED, ASK: left after redis-py followed the redirections it could
    redis.exceptions.SlotNotCoveredError,  # no node serves the slot (yet)
)
#: The same, from the first word of a reply redis-py has no class for.
NOT_THE_MASTER_CODES = (
    "NOREPLICAS",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "READONLY",
    "LOADING",
    "UNBLOCKED",  # a blocking command cut short: "instance state changed (master -> replica?)"
)


#: What redis-py's RedisClusterException says when the cluster cannot be reached.
_CLUSTER_UNREACHABLE = ("cannot be connected", "could not agree on a valid slots", "slots are not covered")


def is_pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is this process's connection pool having none left
    to give (redis-py's MaxConnectionsError, a plain ConnectionError before
    redis-py 6): no outage, Redis was not even asked."""
    exhausted = getattr(redis.exceptions, "MaxConnectionsError", None)
    if exhausted is not None and isinstance(exc, exhausted):
        return True
    return isinstance(exc, redis.ConnectionError) and str(exc) == "Too many connections"


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis cannot take commands right now: it cannot
    be reached, it timed out, or the node answered that it is not the master
    (READONLY, MASTERDOWN, NOREPLICAS, CLUSTERDOWN, TRYAGAIN, a redirection
    left over, no node for the slot). Retried with backoff, never a job
    failure nor a broken queue."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, *NOT_THE_MASTER)):
        return True
    if isinstance(exc, redis.exceptions.RedisClusterException):
        # Not a RedisError: redis-py's cluster client raises it when no
        # node answers too; a command it cannot route stays an error.
        return any(words in str(exc) for words in _CLUSTER_UNREACHABLE)
    return isinstance(exc, redis.ResponseError) and _NOT_THE_MASTER_REPLY.search(str(exc)) is not None


#: The code opens the reply; from inside a script, Redis 6.2 puts it after
#: the script's name and line ("@user_script: 25: -READONLY You can't...").
_NOT_THE_MASTER_REPLY = re.compile(r"(?:^|[\s-])(?:" + "|".join(NOT_THE_MASTER_CODES) + r")\b")


class RedisAccessRefused(RedisRefused):
    """Redis refuses this client outright: a wrong password or user, a
    database number the server does not have, an ACL without the commands
    cogworker needs. Retrying cannot help; the worker exits at boot."""


def is_unknown_command(exc: redis.ResponseError) -> bool:
    """Whether Redis refused a command it does not know (an old server: G10)."""
    text = str(exc).lower()
    return "unknown command" in text or "unknown redis command" in text


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write because its memory is full
    (``maxmemory`` reached, with ``noeviction``): an OOM reply, or, from
    inside a script on Redis 6.2, the same reply after the script's name."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.ResponseError) and _FULL_REPLY.search(str(exc)) is not None


_FULL_REPLY = re.compile(r"(?:^|[\s-])OOM command not allowed")


def full_message(used_bytes: int | None = None, maxmemory_bytes: int | None = None) -> str:
    """How a full Redis is said everywhere (the worker, the API, the admin,
    ``cogworker_status``), with its figures when they were read."""
    figures = ""
    if used_bytes is not None and maxmemory_bytes:
        figures = f" ({used_bytes / 2**20:.1f} MB used of {maxmemory_bytes / 2**20:.1f} MB maxmemory)"
    return f"Redis is full{figures}: it refuses new jobs until workers have taken enough of them"


def refusal(exc: BaseException) -> str | None:
    """What to tell the operator when ``exc`` is Redis refusing this client
    outright, a refusal that no retry will change (None otherwise): at the
    worker's boot, at ``.delay()``, in the admin and ``cogworker_status``."""
    if isinstance(exc, redis.AuthenticationError) and "required" in str(exc):  # NOAUTH: none was given
        return "Redis asks for credentials: set the user and password in REDIS_URL"
    if isinstance(exc, redis.AuthenticationError):
        return (
            "Redis refused the credentials: check the user and password in REDIS_URL "
            "(or in the cache CACHE_ALIAS names)"
        )
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return "the Redis user lacks a command cogworker needs (docs/deployment.md lists them)"
    if isinstance(exc, redis.ResponseError) and "DB index is out of range" in str(exc):
        return "the database number in REDIS_URL is not one the server has (see its 'databases' setting)"
    return None


def translate(
    exc: BaseException, doing: str, *, refused: type[RedisRefused] = RedisRefused
) -> CogworkerError:
    """Our error for a redis-py error met while trying to ``doing`` ("enqueue",
    "read the dead set"): :class:`RedisUnavailable` when Redis cannot take
    commands now (:func:`is_unavailable`: unreachable, or a failover under
    way), :class:`RedisAccessRefused` when Redis refuses this client (a
    wrong password, a database it does not have: :func:`refusal`),
    ``refused`` (by default :class:`RedisRefused`) for any other answer
    Redis gave, saying so when Redis is full. The message keeps redis-py's
    text, which names the host and port (or socket path) and never the
    password. Raise it with ``raise translate(exc, doing) from exc``
    (``exc`` loses redis-py's frames: :func:`without_redis_frames`)."""
    without_redis_frames(exc)
    # Before is_unavailable: redis-py's AuthenticationError is a
    # ConnectionError, and a refused password is no outage.
    access = refusal(exc)
    if access is not None:
        return RedisAccessRefused(f"could not {doing}: {access} (Redis said: {exc})")
    if is_full(exc):
        return refused(f"could not {doing}: {full_message()} ({exc})", full=True)
    if is_pool_exhausted(exc):
        return RedisUnavailable(
            f"could not {doing}: every connection of this process's Redis pool is in use "
            f"(raise max_connections in REDIS_OPTIONS) ({exc})"
        )
    if is_unavailable(exc):
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            return RedisUnavailable(f"could not {doing}: Redis is unreachable ({exc})")
        return RedisUnavailable(f"could not {doing}: Redis has no master to take it now ({exc})")
    return refused(f"could not {doing}: Redis refused it ({exc})")


#: What a page catches around its reads of Redis (the admin's, the metrics
#: endpoint's), to answer 503 for the ones :func:`redis_failure` finds.
PAGE_CATCHES = (CogworkerError, redis.RedisError, redis.exceptions.RedisClusterException)


def redis_failure(exc: BaseException, doing: str) -> CogworkerError | None:
    """The error a page answers 503 for, from ``exc`` caught as one of
    :data:`PAGE_CATCHES` while trying to ``doing``: Redis unreachable or
    refusing (ours as it is, redis-py's through :func:`translate`); None
    for any other error of ours, which the page raises again."""
    if isinstance(exc, RedisUnavailable | RedisRefused):
        return exc
    if isinstance(exc, CogworkerError):
        return None
    return translate(exc, doing)


#: Called with every redis-py error a :func:`redis_boundary` meets, before it
#: is translated: registered by the module that reacts (the connection), so
#: that this one imports none of ours.
_reactions: list[Callable[[BaseException], None]] = []


def react_with(reaction: Callable[[BaseException], None]) -> None:
    """Has ``reaction(exc)`` called for each redis-py error met at a
    :func:`redis_boundary`, before it is raised as ours (once, however
    often it is registered)."""
    if reaction not in _reactions:
        _reactions.append(reaction)


def redis_boundary(doing: str, *, refused: type[RedisRefused] = RedisRefused) -> _Boundary:
    """Raises redis-py's errors from the block (or the decorated function)
    as ours, through :func:`translate`, ``from`` the original::

        with redis_boundary("enqueue", refused=EnqueueRefused):
            pipe.execute()

        @redis_boundary("read the queues")
        def all(cls) -> list[Queue]: ...

    A generator must use it inside its body: decorating one covers only its
    creation, not the iteration."""
    return _Boundary(doing, refused)


#: What :func:`redis_boundary` catches: redis-py's errors.
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)


def crossing(exc: BaseException, doing: str, *, refused: type[RedisRefused] = RedisRefused) -> CogworkerError:
    """What :func:`redis_boundary` raises for redis-py's ``exc``, the
    reactions told first, for a path that catches :data:`REDIS_ERRORS`
    itself: ``.delay()``'s push, where a ``with`` costs three calls, cold."""
    for reaction in _reactions:
        reaction(exc)
    return translate(exc, doing, refused=refused)


class _Boundary(contextlib.ContextDecorator):
    """:func:`redis_boundary`'s context: a class, not a generator."""

    def __init__(self, doing: str, refused: type[RedisRefused]) -> None:
        self.doing = doing
        self.refused = refused

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, REDIS_ERRORS):
            raise crossing(exc, self.doing, refused=self.refused) from exc


_REDIS_PY = os.path.dirname(redis.__file__) + os.sep


def without_redis_frames(exc: BaseException) -> BaseException:
    """``exc``, its traceback (and those of the errors chained to it) left
    without redis-py's own frames; ours stay, and every message. Their
    locals hold secrets (AUTH's arguments, a client's keyword arguments),
    and a traceback's captured locals are what Sentry's events and Django's
    DEBUG page print."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        kept: list[TracebackType] = []
        tb = current.__traceback__
        while tb is not None:
            if not tb.tb_frame.f_code.co_filename.startswith(_REDIS_PY):
                kept.append(tb)
            tb = tb.tb_next
        for i, entry in enumerate(kept):
            entry.tb_next = kept[i + 1] if i + 1 < len(kept) else None
        current.__traceback__ = kept[0] if kept else None
        todo += [current.__cause__, current.__context__]
    return exc
