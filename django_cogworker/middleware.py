"""Client and server middleware: the two chains every job passes through.

Duties:
- build each chain once per process from ``COGWORKER["MIDDLEWARE"]``
  (``{"client": [...], "server": [...]}``, dotted paths of classes made with
  no arguments), always with our own middleware first: unique jobs
  (:mod:`django_cogworker.unique`) and the periodic running lock
  (:mod:`django_cogworker.periodic`), so a user's middleware cannot skip the
  locks and sees payloads the locks let through;
- client side, around enqueue: each middleware may change the payload or
  refuse it (return None); a refused payload is not pushed and ``.delay()``
  returns None. The middleware that had already let it through are told
  (``cancel``, in reverse order) so that they can undo what they did, such as
  a unique lock taken for a job that will never exist;
- server side, around execution: ``before`` in order before the job runs,
  ``after`` in reverse order once the outcome is known (success, retry, dead
  or dropped), so that a lock is released when the job ends for good and
  kept over a retry. ``after`` is called only on the middleware whose
  ``before`` returned; a failing ``after`` is logged and never changes the
  outcome; a failing ``before`` fails the run like the job's own exception.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from django.utils.module_loading import import_string

from django_cogworker.conf import get_config
from django_cogworker.errors import ConfigurationError
from django_cogworker.payload import Payload

logger = logging.getLogger("django_cogworker")

#: Always first in their chain, before the user's.
BUILTIN_CLIENT = ("django_cogworker.unique.UniqueClientMiddleware",)
BUILTIN_SERVER = (
    "django_cogworker.unique.UniqueServerMiddleware",
    "django_cogworker.periodic.PeriodicLockMiddleware",
)

# How a run ended, as ``after`` is told.
SUCCESS = "success"
RETRY = "retry"  # filed in the retry set: it runs again
DEAD = "dead"  # exhausted: filed in the dead set
DROPPED = "dropped"  # exhausted with ``dead=False``: gone
WAITING = "waiting"  # met a full limiter in its code: it runs again, not a failure


@dataclass(frozen=True)
class Result:
    """How a run ended: ``status`` (SUCCESS, RETRY, DEAD, DROPPED or WAITING), the
    exception of a failed run, and for a retry when it is due (epoch s)."""

    status: str
    exc: BaseException | None = None
    retry_at: float | None = None

    @property
    def failed(self) -> bool:
        return self.status not in (SUCCESS, WAITING)

    @property
    def final(self) -> bool:
        """The job will not run again (success or a terminal failure)."""
        return self.status not in (RETRY, WAITING)


class ClientMiddleware:
    """Runs in the enqueuing process, before a payload is pushed."""

    #: The payload fields this middleware acts on, for one that passes a
    #: payload without any of them as it is (the unique lock:
    #: ``unique_for``). When every middleware of the chain names its
    #: fields, a payload with none of them skips the chain: neither
    #: ``enqueue`` nor ``cancel`` is called. None (the default): every
    #: payload goes through.
    acts_on: ClassVar[frozenset[str] | None] = None

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        """The payload to push (this one or a changed copy), or None to refuse
        it. ``at`` is when a scheduled job is due (epoch s), None for now."""
        return payload

    def cancel(self, payload: Payload) -> None:
        """A payload this middleware let through will not be pushed after all
        (a later middleware refused it, or the push failed)."""

    def passes_unchanged(self, payload: Payload) -> bool:
        """Whether :meth:`enqueue` returns every payload of this one's job
        as it is, unchanged and never refused. When every middleware of
        the chain says so, ``delay_many`` skips the chain and encodes its
        payloads together. By default, True only for a payload with none
        of the fields named in :attr:`acts_on`."""
        return self.acts_on is not None and self.acts_on.isdisjoint(payload)


class ServerMiddleware:
    """Runs in the worker, in the job's thread and context (``current_job()``).

    For ``async def`` jobs, which run on the worker's event loop, a
    middleware may define ``async def abefore(payload)`` and ``async def
    aafter(payload, result)``: they are awaited instead of ``before`` and
    ``after``, which otherwise run on the loop and must not block it."""

    #: The payload fields this middleware acts on, for one that does
    #: nothing to a payload without any of them (the unique and periodic
    #: locks). When every middleware of the chain names its fields, a
    #: payload with none of them skips the chain: neither ``before`` nor
    #: ``after`` is called. None (the default): every payload goes through.
    acts_on: ClassVar[frozenset[str] | None] = None

    def before(self, payload: Payload) -> None:
        """Before the job runs. Raising fails this run like the job would."""

    def after(self, payload: Payload, result: Result) -> None:
        """Once the outcome is known, before it is written to Redis."""


class ClientChain:
    def __init__(self, items: Iterable[ClientMiddleware]) -> None:
        self.items = tuple(items)
        self.acts_on = _acts_on(self.items)

    def run(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        """The payload to push, or None if a middleware refused it."""
        if self.acts_on is not None and self.acts_on.isdisjoint(payload):
            return payload  # nothing in the chain acts on it
        passed: list[ClientMiddleware] = []
        for item in self.items:
            try:
                changed = item.enqueue(payload, at=at)
            except BaseException:
                _cancel(passed, payload)
                raise
            if changed is None:
                logger.debug("jid=%s %s refused by %s", payload.get("jid"), payload.get("job"), _name(item))
                _cancel(passed, payload)
                return None
            passed.append(item)
            payload = changed
        return payload

    def cancel(self, payload: Payload) -> None:
        """Undo a whole run: its payload will not be pushed after all."""
        if self.acts_on is None or not self.acts_on.isdisjoint(payload):
            _cancel(list(self.items), payload)

    def passes_unchanged(self, payload: Payload) -> bool:
        """Whether :meth:`run` returns every payload of this one's job as
        it is (``ClientMiddleware.passes_unchanged``)."""
        return all(item.passes_unchanged(payload) for item in self.items)


#: A server middleware with its async forms (``abefore``, ``aafter``), None where it has none.
Forms = tuple[ServerMiddleware, Callable[..., Awaitable[None]] | None, Callable[..., Awaitable[None]] | None]


class ServerRun:
    """One run of one payload through the server chain."""

    def __init__(self, chain: ServerChain, payload: Payload) -> None:
        self.items = chain.items
        self.forms = chain.forms
        self.payload = payload
        self.entered: list[ServerMiddleware] = []

    def before(self) -> None:
        for item in self.items:
            item.before(self.payload)
            self.entered.append(item)

    def after(self, result: Result) -> None:
        for item in reversed(self.entered):
            try:
                item.after(self.payload, result)
            except Exception:
                self._after_failed(item)

    async def abefore(self) -> None:
        """:meth:`before` for an ``async def`` job: a middleware's
        ``abefore`` awaited where it has one."""
        for item, form, _ in self.forms:
            if form is not None:
                await form(self.payload)
            else:
                item.before(self.payload)
            self.entered.append(item)

    async def aafter(self, result: Result) -> None:
        """:meth:`after` for an ``async def`` job (``aafter`` where defined)."""
        for item, _, form in reversed(self.forms[: len(self.entered)]):  # entered: the first ones
            try:
                if form is not None:
                    await form(self.payload, result)
                else:
                    item.after(self.payload, result)
            except Exception:
                self._after_failed(item)

    def _after_failed(self, item: ServerMiddleware) -> None:
        logger.exception("server middleware %s failed after jid=%s", _name(item), self.payload.get("jid"))


class ServerChain:
    def __init__(self, items: Iterable[ServerMiddleware]) -> None:
        self.items = tuple(items)
        # Looked up once: a middleware without them would otherwise cost an
        # AttributeError raised and caught twice per async job.
        self.forms: tuple[Forms, ...] = tuple(
            (item, getattr(item, "abefore", None), getattr(item, "aafter", None)) for item in self.items
        )
        self.acts_on = _acts_on(self.items)

    def start(self, payload: Payload) -> ServerRun:
        if self.acts_on is not None and self.acts_on.isdisjoint(payload):
            return UNTOUCHED  # nothing in the chain acts on it
        # A copy shared by before() and after(): what a middleware writes in
        # it reaches neither the job nor the payload filed in retry or dead.
        return ServerRun(self, dict(payload))


def _acts_on(items: tuple[ClientMiddleware | ServerMiddleware, ...]) -> frozenset[str] | None:
    """The fields a chain of ``items`` acts on (their ``acts_on``); None
    when one of them acts on every payload."""
    named = [item.acts_on for item in items]
    if any(fields is None for fields in named):
        return None
    return frozenset(field for fields in named if fields is not None for field in fields)


#: The run of a payload that no middleware of its chain acts on: it has no
#: middleware to call (``items`` and ``forms`` empty).
UNTOUCHED = ServerRun(ServerChain(()), {})


def _cancel(passed: list[ClientMiddleware], payload: Payload) -> None:
    for item in reversed(passed):
        try:
            item.cancel(payload)
        except Exception:
            logger.exception("client middleware %s failed to cancel jid=%s", _name(item), payload.get("jid"))


def _name(item: Any) -> str:
    cls = type(item)
    return f"{cls.__module__}.{cls.__qualname__}"


_lock = threading.Lock()
_Chain = TypeVar("_Chain", ClientChain, ServerChain)

_client_chains: dict[tuple[str, ...], ClientChain] = {}
_server_chains: dict[tuple[str, ...], ServerChain] = {}


def _build(paths: tuple[str, ...], base: type) -> list[Any]:
    items = []
    for path in paths:
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ConfigurationError(f"COGWORKER['MIDDLEWARE']: cannot import {path!r} ({exc})") from exc
        item = cls()
        if not isinstance(item, base):
            raise ConfigurationError(
                f"COGWORKER['MIDDLEWARE']: {path!r} is not a {base.__name__} subclass; "
                f"derive it from django_cogworker.middleware.{base.__name__}"
            )
        items.append(item)
    return items


def client_chain() -> ClientChain:
    """This process's client chain for the current settings (built once)."""
    paths = BUILTIN_CLIENT + get_config().client_middleware
    return _cached(_client_chains, paths, lambda: ClientChain(_build(paths, ClientMiddleware)))


#: The last chain :func:`server_chain` returned, by the setting it read.
_last_server: tuple[tuple[str, ...], ServerChain] | None = None


def server_chain() -> ServerChain:
    """This process's server chain for the current settings (built once)."""
    global _last_server
    configured = get_config().server_middleware
    last = _last_server
    if last is not None and last[0] is configured:
        return last[1]  # once per job: no tuple built and hashed
    paths = BUILTIN_SERVER + configured
    chain = _cached(_server_chains, paths, lambda: ServerChain(_build(paths, ServerMiddleware)))
    _last_server = (configured, chain)
    return chain


def _cached(
    cache: dict[tuple[str, ...], _Chain], paths: tuple[str, ...], make: Callable[[], _Chain]
) -> _Chain:
    chain = cache.get(paths)
    if chain is None:
        with _lock:
            chain = cache.get(paths)
            if chain is None:
                chain = cache[paths] = make()
    return chain
