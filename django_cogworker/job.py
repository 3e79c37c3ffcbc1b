"""The ``Job`` that ``@job`` (:mod:`django_cogworker.registry`) returns:
``.delay()`` and friends.

``Job.set(...)`` returns a modified copy (like Django's ``Task.using``), so a
per-call option never leaks into the registered job.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Iterable, MutableSet, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_cogworker import client, collector, expiry
from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.connection import get_redis
from django_cogworker.errors import EnqueueRefused, redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.limits.limiter import Limiter
from django_cogworker.payload import Payload, check_arguments, check_shape, new_jid, new_jids

if TYPE_CHECKING:
    from django_cogworker.workflows.signature import Signature

RetryIn = Callable[[int, BaseException], float | int | None]
OnExhausted = Callable[[Payload, BaseException], Any]

UNIQUE_UNTIL = ("success", "start")

#: Call shapes remembered per job as accepted by its signature (a job
#: called with many sets of keyword names checks the others each time).
MAX_CALLABLE_SHAPES = 64


def is_retry(value: object) -> bool:
    """Whether ``value`` is a job's ``retry``: True (``DEFAULT_RETRY``
    retries), False (none), or a whole number of retries >= 0. The one
    rule for ``@job``, ``.set()``, ``@retry_options`` and the Tasks
    backend's ``OPTIONS['RETRY']``."""
    return isinstance(value, bool) or (isinstance(value, int) and value >= 0)


@dataclasses.dataclass(frozen=True)
class Job:
    func: Callable[..., Any]
    name: str
    queue: str = DEFAULT_QUEUE
    retry: bool | int = True
    dead: bool = True
    retry_in: RetryIn | None = None
    on_exhausted: OnExhausted | None = None
    unique_for: float | None = None
    unique_until: str = "success"
    timeout: float | None = None
    hard_timeout: float | None = None
    #: Seconds after it is due that the job may still start (``expires``);
    #: ``.set(expires_in=...)`` per call.
    expires: float | None = None
    #: A limiter (``limits.Concurrency``, ``limits.Rate``), or a callable of
    #: the job's arguments that returns one, evaluated at each start.
    limit: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise TypeError(f"job {self.name!r}: queue must be a non-empty string")
        if storable(self.queue) != self.queue:
            raise TypeError(
                f"job {self.name!r}: queue {self.queue!r} holds a lone surrogate, which no Redis key can "
                "carry; name the queue in text that UTF-8 can encode"
            )
        if not is_retry(self.retry):
            raise TypeError(f"job {self.name!r}: retry must be True, False or a whole number >= 0")
        if self.unique_until not in UNIQUE_UNTIL:
            raise TypeError(f"job {self.name!r}: unique_until must be one of {UNIQUE_UNTIL}")
        if self.unique_for is not None and not (
            isinstance(self.unique_for, int | float) and self.unique_for > 0
        ):
            raise TypeError(f"job {self.name!r}: unique_for must be a positive number of seconds or None")
        if self.expires is not None and not expiry.is_expires(self.expires):
            raise TypeError(
                f"job {self.name!r}: expires (expires_in in set()) must be a positive number of seconds "
                f"or None, not {self.expires!r}"
            )
        if self.limit is not None and not (isinstance(self.limit, Limiter) or callable(self.limit)):
            raise TypeError(
                f"job {self.name!r}: limit must be a limits.Concurrency, a limits.Rate, or a callable of the "
                f"job's arguments that returns one, not {self.limit!r}"
            )
        self.check_time_limits()

    def check_time_limits(self) -> None:
        """``timeout`` and ``hard_timeout`` (SPEC section 14): positive
        seconds or None, and a hard limit no shorter than the soft one."""
        for option in ("timeout", "hard_timeout"):
            value = getattr(self, option)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise TypeError(f"job {self.name!r}: {option} must be a positive number of seconds or None")
        if self.timeout is not None and self.hard_timeout is not None and self.hard_timeout < self.timeout:
            raise TypeError(
                f"job {self.name!r}: hard_timeout ({self.hard_timeout:g}s) must not be shorter than timeout "
                f"({self.timeout:g}s): the process would exit before the job's own timeout could stop it"
            )

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call, for a workflow (SPEC section 13),
        checked now as ``.delay()`` checks its arguments."""
        from django_cogworker.workflows.signature import Signature  # workflows load when first used

        return Signature.of(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain, it takes no previous result."""
        return self.s(*args, **kwargs).si()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A plain call runs the function inline; nothing is enqueued."""
        return self.func(*args, **kwargs)

    def set(self, **options: Any) -> Job:
        """A copy with per-call options (``queue``, ``retry``, ``dead``,
        ``expires_in``, ...)."""
        if "expires_in" in options:
            options["expires"] = options.pop("expires_in")
        local = {"retry_in", "on_exhausted", "limit"} & set(options)
        if local:
            # A payload is JSON: functions cannot travel with it, so a worker
            # always uses the registered job's own.
            raise TypeError(
                f"job {self.name!r}: {', '.join(sorted(local))} cannot be set per call (a worker uses the "
                "function given to @job); pass it to @job instead"
            )
        unknown = set(options) - {f.name for f in dataclasses.fields(self)} - {"func", "name"}
        if unknown or {"func", "name"} & set(options):
            bad = sorted(unknown | ({"func", "name"} & set(options)))
            raise TypeError(f"job {self.name!r}: unknown option(s) for set(): {', '.join(bad)}")
        return dataclasses.replace(self, **options)

    @functools.cached_property
    def coroutine(self) -> bool:
        """An ``async def`` job: a worker awaits it on its event loop (SPEC
        section 15), beside its threads."""
        return inspect.iscoroutinefunction(self.func)

    @functools.cached_property
    def signature(self) -> inspect.Signature | None:
        """The function's signature, to check calls against at enqueue time
        (None when Python cannot tell it, as for some built-ins)."""
        try:
            return inspect.signature(self.func)
        except (TypeError, ValueError):
            return None

    @functools.cached_property
    def _callable_shapes(self) -> MutableSet[tuple[Any, ...]]:
        """Shapes of calls the signature took: how many positional arguments,
        then the keyword names. ``Signature.bind`` looks at nothing else, and
        it costs about as much as building the rest of the payload for a job
        with a few parameters (``delay_many``'s calls mostly share one
        shape)."""
        return set()

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Raises TypeError, naming the job, if the function could not be
        called with these arguments: at ``.delay()``, not in the worker."""
        signature = self.signature
        if signature is None:
            return
        shape = (len(args), *kwargs)
        known = self._callable_shapes
        if shape in known:
            return
        try:
            signature.bind(*args, **kwargs)
            if len(known) < MAX_CALLABLE_SHAPES:
                known.add(shape)
        except TypeError as exc:
            bare = signature.replace(
                parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                return_annotation=signature.empty,
            )
            raise TypeError(
                f"job {self.name!r} cannot be called with these arguments ({exc}); it takes "
                f"{bare}. Nothing was enqueued."
            ) from None

    def payload(
        self, args: Sequence[Any], kwargs: dict[str, Any], now: float | None = None, jid: str | None = None
    ) -> Payload:
        check_arguments(self.name, args, kwargs)
        now = time.time() if now is None else now
        payload: Payload = {
            "jid": new_jid() if jid is None else jid,
            "job": self.name,
            "args": list(args),
            "kwargs": kwargs,
            "queue": self.queue,
            "retry": self.retry,
            "created_at": now,
            "enqueued_at": now,
        }
        if not self.dead:
            payload["dead"] = False
        if self.unique_for is not None:
            payload["unique_for"] = self.unique_for
            payload["unique_until"] = self.unique_until
        if self.timeout is not None:
            payload["timeout"] = self.timeout
        if self.hard_timeout is not None:
            payload["hard_timeout"] = self.hard_timeout
        return payload

    def checked_payload(
        self, args: Sequence[Any], kwargs: dict[str, Any], now: float | None = None, jid: str | None = None
    ) -> Payload:
        """:meth:`payload` for a call that ``.delay()`` and friends make:
        JSON arguments that arrive as they were passed, and that the
        function accepts."""
        payload = self.payload(args, kwargs, now, jid)
        check_shape(self.name, args, kwargs)
        self.check_call(args, kwargs)
        return payload

    def expiring(self, payload: Payload, due: float | None) -> Payload:
        """The payload with its deadline, ``expires_at`` on Redis's clock,
        for a job with ``expires`` due at ``due`` (None: now)."""
        assert self.expires is not None
        with redis_boundary("enqueue", refused=EnqueueRefused):
            payload[expiry.FIELD] = expiry.deadline(get_redis(), self.expires, due)
        return payload

    def delay(self, *args: Any, **kwargs: Any) -> str | None:
        """Enqueue now. Returns the jid (None if a client middleware refused)."""
        payload = self.checked_payload(args, kwargs)
        if self.expires is not None:
            self.expiring(payload, None)
        return client.enqueue(payload)

    def delay_in(self, seconds: float | timedelta, *args: Any, **kwargs: Any) -> str | None:
        """Enqueue to run after ``seconds`` (a number or a timedelta)."""
        at = _after(seconds)
        payload = self.checked_payload(args, kwargs)
        if self.expires is not None:
            self.expiring(payload, at)
        return client.enqueue(payload, at=at)

    def delay_at(self, when: datetime | float | int, *args: Any, **kwargs: Any) -> str | None:
        """Enqueue to run at ``when`` (an aware datetime, or epoch seconds)."""
        at = self.epoch(when)
        payload = self.checked_payload(args, kwargs)
        if self.expires is not None:
            self.expiring(payload, at)
        return client.enqueue(payload, at=at)

    def epoch(self, when: datetime | float | int) -> float:
        """``delay_at``'s ``when`` as epoch seconds."""
        if isinstance(when, datetime):
            if when.tzinfo is None:
                raise ValueError(f"job {self.name!r}: delay_at() needs an aware datetime, got a naive one")
            return when.timestamp()
        return float(when)

    def delay_many(
        self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], *, chunk_size: int = 1000
    ) -> list[str]:
        """Enqueue many calls, pushed in chunks; returns their jids.

        Every call's arguments are checked before anything is pushed. The
        cyclic garbage collector waits for the end of the call
        (``collector.held_off``)."""
        with collector.held_off():
            return client.enqueue_many(self.many_payloads(calls), chunk_size=chunk_size, alike=True)

    def many_payloads(self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]) -> list[Payload]:
        """The checked payloads of ``delay_many``'s calls, one deadline for
        all: :meth:`payload`'s, whose fields past ``kwargs`` are the very
        same objects in all of them (``bulk.encode_alike``)."""
        now = time.time()
        calls = list(calls)
        if not calls:
            return []
        jids = new_jids(len(calls))
        first = self.checked_payload(*calls[0], now, jids[0])
        rest = dict(list(first.items())[4:])
        name, check_call, payloads = self.name, self.check_call, [first]
        for (args, kwargs), jid in zip(calls[1:], jids[1:], strict=True):
            check_arguments(name, args, kwargs)
            check_shape(name, args, kwargs)
            check_call(args, kwargs)
            payloads.append({"jid": jid, "job": name, "args": list(args), "kwargs": kwargs, **rest})
        if self.expires is not None:
            at = self.expiring(first, now)[expiry.FIELD]
            for payload in payloads:
                payload[expiry.FIELD] = at
        return payloads

    # -- from async code (SPEC section 15): redis.asyncio, the same checks --------------

    async def adelay(self, *args: Any, **kwargs: Any) -> str | None:
        """:meth:`delay` for async code: the loop is never blocked on Redis."""
        if client.sync_only():
            return await sync_to_async(self.delay)(*args, **kwargs)
        return await self._apush(self.checked_payload(args, kwargs), None)

    async def adelay_in(self, seconds: float | timedelta, *args: Any, **kwargs: Any) -> str | None:
        """:meth:`delay_in` for async code."""
        if client.sync_only():
            return await sync_to_async(self.delay_in)(seconds, *args, **kwargs)
        at = _after(seconds)
        return await self._apush(self.checked_payload(args, kwargs), at)

    async def adelay_at(self, when: datetime | float | int, *args: Any, **kwargs: Any) -> str | None:
        """:meth:`delay_at` for async code."""
        if client.sync_only():
            return await sync_to_async(self.delay_at)(when, *args, **kwargs)
        at = self.epoch(when)
        return await self._apush(self.checked_payload(args, kwargs), at)

    async def adelay_many(
        self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], *, chunk_size: int = 1000
    ) -> list[str]:
        """:meth:`delay_many` for async code."""
        if client.sync_only():
            return await sync_to_async(self.delay_many)(calls, chunk_size=chunk_size)
        if self.expires is not None:
            # Redis's clock may have to be read (TIME): in a thread, once.
            payloads = await sync_to_async(self.many_payloads, thread_sensitive=False)(calls)
        else:
            payloads = self.many_payloads(calls)
        return await client.aenqueue(payloads, None, chunk_size=chunk_size, alike=True)

    async def _apush(self, payload: Payload, at: float | None) -> str | None:
        if self.expires is not None:
            await sync_to_async(self.expiring, thread_sensitive=False)(payload, at)
        jids = await client.aenqueue([payload], at)
        return jids[0] if jids else None


def _after(seconds: float | timedelta) -> float:
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    return time.time() + float(seconds)
