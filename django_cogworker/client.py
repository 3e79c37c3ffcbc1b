"""The enqueue side: payloads to Redis, after commit when in a transaction.

The one write path of an enqueue: ``.delay()``, ``delay_many`` and the
Tasks backend all push through :func:`push` (or :func:`apush` from async
code), so they register queues, translate errors and release locks alike.

``.delay()`` costs one round trip, an LPUSH (and a SADD of the queue name
before it once a minute; pipelined on redis-py's way, with the ``WAIT`` of
:mod:`django_cogworker.confirm` under ``ENQUEUE_WAIT_REPLICAS``). A connection error
is raised to the caller as RedisUnavailable before anything is written
(SPEC section 8); a pipeline that never reached Redis wrote nothing, and so
is a failover's READONLY. A refusal (OOM under maxmemory, a key of the
wrong type) is EnqueueRefused, with the server's reason; both
come from :func:`django_cogworker.errors.crossing`, as a ``redis_boundary``'s.

Every payload first passes the client middleware chain
(:mod:`django_cogworker.middleware`, unique locks included), which may change
it or refuse it: a refused payload is not pushed and ``.delay()`` returns
None. When the push fails, the chain is told, so that a unique lock taken for
the payload is released.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.db import transaction

from django_cogworker import atomic, confirm, direct, middleware
from django_cogworker.bulk import Encoded, bytes_of
from django_cogworker.conf import get_config
from django_cogworker.connection import async_redis, get_keys, get_master, get_redis
from django_cogworker.errors import (
    REDIS_ERRORS,
    EnqueueNotReplicated,
    EnqueueRefused,
    crossing,
    redis_boundary,
)
from django_cogworker.installed import NotInstalledWarning, warn_if_not_installed  # noqa: F401 (re-exported)
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode

#: The testing helpers' inline mode: when set, payloads go to it, not to Redis.
inline_runner: Callable[[Payload], Any] | None = None

#: The batch being built in this context (``workflows/batch.py``): what
#: is enqueued inside its ``with`` block is handed to it (the payloads the
#: client chain accepted, their chain, ``at``), and pushed at its exit.
Sink = Callable[[middleware.ClientChain, list[Payload], float | None], None]
collecting: ContextVar[Sink | None] = ContextVar("cogworker_batch", default=None)

#: Commands to queue on an enqueue's pipeline beside its payloads (the Tasks
#: backend's result record): given one, the push is a MULTI.
Also = Callable[[Any], object]


def enqueue(payload: Payload, at: float | None = None) -> str | None:
    chain = middleware.client_chain()
    ready = chain.run(payload, at=at)
    if ready is None:
        return None
    sink = collecting.get()
    if sink is not None:
        sink(chain, [ready], at)
        return str(ready["jid"])
    deliver(chain, [ready], at, on_commit=get_config().enqueue_on_commit)
    return str(ready["jid"])


def enqueue_many(payloads: list[Payload], *, chunk_size: int = 1000, alike: bool = False) -> list[str]:
    """Pushes the payloads the client chain accepts (``alike``: see
    :func:`_accepted`); returns their jids."""
    chain = middleware.client_chain()
    payloads, alike = _accepted(chain, payloads, None, alike)
    jids = [str(p["jid"]) for p in payloads]
    sink = collecting.get()
    if sink is not None:
        sink(chain, payloads, None)
        return jids
    unconfirmed: list[EnqueueNotReplicated] = []
    on_commit = get_config().enqueue_on_commit
    for start in range(0, len(payloads), chunk_size):
        chunk = payloads[start : start + chunk_size]
        try:
            deliver(chain, Encoded(chunk) if alike else chunk, None, on_commit=on_commit)
        except EnqueueNotReplicated as exc:
            unconfirmed.append(exc)  # pushed: the next chunks go on, and one error names them all
    _raise_unconfirmed(unconfirmed, len(jids))
    return jids


def sync_only() -> bool:
    """Whether an async enqueue must take the synchronous path (in a thread):
    inline mode runs jobs in the caller's thread; django-redis has no asyncio client."""
    return inline_runner is not None or bool(get_config().cache_alias)


async def aenqueue(
    payloads: list[Payload], at: float | None, *, chunk_size: int = 1000, alike: bool = False
) -> list[str]:
    """:func:`enqueue` and :func:`enqueue_many` for async code (``adelay``
    and friends): the same chain, then :func:`apush` on ``redis.asyncio``.
    Pushed at once, never on commit: Django's ``atomic()`` and
    ``on_commit`` are synchronous, so no transaction of Django's is open in
    async code (see docs/async.md)."""
    warn_if_not_installed()
    chain = middleware.client_chain()
    payloads, alike = _accepted(chain, payloads, at, alike)
    sink = collecting.get()
    if sink is not None:
        sink(chain, payloads, at)
        return _jids(payloads)
    unconfirmed: list[EnqueueNotReplicated] = []
    for start in range(0, len(payloads), chunk_size):
        try:
            chunk = payloads[start : start + chunk_size]
            await apush(chain, Encoded(chunk) if alike else chunk, at)
        except EnqueueNotReplicated as exc:
            unconfirmed.append(exc)
    _raise_unconfirmed(unconfirmed, len(payloads))
    return _jids(payloads)


def _accepted(
    chain: middleware.ClientChain, payloads: list[Payload], at: float | None, alike: bool
) -> tuple[list[Payload], bool]:
    """The payloads the chain accepts, and whether they are still ``alike``:
    ``Job.many_payloads``'s, which a chain that passes them unchanged need
    not see, encoded together (:mod:`django_cogworker.bulk`)."""
    if alike and payloads and chain.passes_unchanged(payloads[0]):
        return payloads, True
    return [ready for ready in (chain.run(p, at=at) for p in payloads) if ready is not None], False


def _raise_unconfirmed(unconfirmed: list[EnqueueNotReplicated], total: int) -> None:
    """One error naming every job a replica did not confirm (all were pushed)."""
    if unconfirmed:
        names = [jid for exc in unconfirmed for jid in exc.jids]
        raise EnqueueNotReplicated(f"{len(names)} of {total} jobs: {unconfirmed[0]}", names)


def inline_mode() -> bool:
    """Whether the testing helpers' inline mode is on (see :func:`deliver`)."""
    return inline_runner is not None


def deliver(
    chain: middleware.ClientChain,
    payloads: list[Payload],
    at: float | None,
    *,
    on_commit: bool,
    also: Also | None = None,
    then: Callable[[], object] | None = None,
) -> bool:
    """The one way out of an enqueue: :func:`push` to Redis (after the
    transaction commits when ``on_commit``), then ``then``; or, in the
    testing helpers' inline mode, ``also``'s writes and ``then`` at once and
    the jobs run in this thread. Returns whether they ran inline."""
    warn_if_not_installed()
    runner = inline_runner
    if runner is not None:
        if also is not None:
            pipe = get_redis().pipeline(transaction=False)
            also(pipe)
            pipe.execute()
        if then is not None:
            then()
        for payload in payloads:
            runner(payload)
        return True

    def write() -> None:
        push(chain, payloads, at, also=also)
        if then is not None:
            then()

    if on_commit and atomic.inside():  # atomic.on_commit_or_now(), inline: a call less for .delay()
        transaction.on_commit(write)
    else:
        write()
    return False


def push(
    chain: middleware.ClientChain, payloads: list[Payload], at: float | None, *, also: Also | None = None
) -> None:
    """Writes payloads the chain accepted: to their queues, or to the
    schedule set at epoch ``at``; with ``also``'s commands in one MULTI."""
    try:
        if also is None:
            _push(payloads, at)  # the seam the tests patch to fail a push
        else:
            _push(payloads, at, also)
    except BaseException as exc:
        _failed(chain, payloads, exc)
        raise


async def apush(
    chain: middleware.ClientChain, payloads: list[Payload], at: float | None, *, also: Also | None = None
) -> None:
    """:func:`push` on a ``redis.asyncio`` client, one pipeline."""
    config = get_config()
    try:
        with redis_boundary("enqueue", refused=EnqueueRefused):
            k = get_keys()
            async with async_redis() as conn:
                if apart := _register_apart(k, payloads, also):
                    await conn.sadd(k.queues, *apart)
                async with conn.pipeline(transaction=also is not None) as pipe:
                    _queue_writes(pipe, k, payloads, at, also)
                    await pipe.execute()
                _registered_now(k, payloads, at)
                if confirm.wanted(config):
                    await confirm.aconfirm(conn, _groups(k, payloads), config, _jids(payloads))
    except BaseException as exc:
        _failed(chain, payloads, exc)
        raise


def _failed(chain: middleware.ClientChain, payloads: list[Payload], exc: BaseException) -> None:
    """Tells the chain to cancel the payloads of a push that raised ``exc``
    (a unique lock taken for one is released), unless they were pushed
    after all (EnqueueNotReplicated). Not a ``with``: .delay() runs it cold."""
    if not isinstance(exc, EnqueueNotReplicated):
        for payload in payloads:
            chain.cancel(payload)


#: Queue names this process registered in ``N:queues`` lately (-> monotonic
#: time): a ``.delay()`` to one is a bare LPUSH. Registered again after
#: QUEUE_REGISTRATION_TTL_S, in case the set was lost.
_registered: dict[tuple[str, str], float] = {}
QUEUE_REGISTRATION_TTL_S = 60.0


def _push(payloads: list[Payload], at: float | None, also: Also | None = None) -> None:
    k = get_keys()
    config = get_config()
    waiting = confirm.wanted(config)
    try:
        client = get_master()
        if (
            at is None
            and (len(payloads) == 1 or isinstance(payloads, Encoded))
            and also is None
            and not waiting
        ):
            queue = payloads[0]["queue"]
            seen = _registered.get((k.namespace, queue))
            fresh = seen is not None and time.monotonic() - seen < QUEUE_REGISTRATION_TTL_S
            # Registered on the LPUSH's own connection too (not sharded), so
            # a process that only enqueues needs no connection of the pool's.
            if fresh or (not k.sharded and direct.sadd(client, k.queues, queue)):
                key = k.queue(queue)
                if isinstance(payloads, Encoded):
                    if direct.call(client, "LPUSH", key, *payloads.raws) is direct.ORDINARY:
                        client.lpush(key, *payloads.raws)
                else:
                    raw = encode(payloads[0])
                    if direct.call(client, "LPUSH", key, raw) is direct.ORDINARY:
                        client.lpush(key, raw)
                if not fresh:
                    _registered_now(k, payloads, at)
                return
        if apart := _register_apart(k, payloads, also):
            client.sadd(k.queues, *apart)
        pipe = client.pipeline(transaction=also is not None)
        written = _queue_writes(pipe, k, payloads, at, also)
        waits = 0
        if waiting and also is None:
            waits = confirm.queue_wait(pipe, client, written, config)
            replies = pipe.execute(raise_on_error=False)
            for reply in replies[:-waits]:
                if isinstance(reply, Exception):
                    raise reply
        else:
            replies = pipe.execute()
        _registered_now(k, payloads, at)
        if waiting and also is not None:
            # A MULTI's pipeline ends at EXEC: WAIT then needs a write of its own.
            confirm.confirm(client, _groups(k, payloads), config, _jids(payloads))
    except REDIS_ERRORS as exc:
        raise crossing(exc, "enqueue", refused=EnqueueRefused) from exc
    if waits:
        confirm.check_all(replies[-waits:], config, _jids(payloads))


def _jids(payloads: list[Payload]) -> list[str]:
    return [str(p["jid"]) for p in payloads]


def _groups(k: Keys, payloads: list[Payload]) -> list[Keys]:
    """The keys of each queue group the payloads go to (one ``Keys``
    without SHARDING)."""
    return list({id(g): g for g in (k.for_payload(p) for p in payloads)}.values())


def _queue_writes(
    pipe: Any, k: Keys, payloads: list[Payload], at: float | None, also: Also | None
) -> list[str]:
    """The commands of a push, on a pipeline (redis-py's or redis.asyncio's);
    returns the keys the jobs are written to."""
    if also is not None:
        also(pipe)
    if at is not None:
        by_set: dict[str, dict[bytes, float]] = {}
        for p, raw in zip(payloads, bytes_of(payloads), strict=True):
            by_set.setdefault(k.for_payload(p).schedule, {})[raw] = at
        for zset, entries in by_set.items():
            pipe.zadd(zset, entries)
        if k.sharded and not _apart(k, also):
            # The views find a group's sets through the queues Redis knows
            # of (shards.known_groups): one with only jobs for later too.
            pipe.sadd(k.queues, *{p["queue"] for p in payloads})
        return list(by_set)
    by_queue: dict[str, list[bytes]] = {}
    for p, raw in zip(payloads, bytes_of(payloads), strict=True):
        by_queue.setdefault(p["queue"], []).append(raw)
    for queue, raws in by_queue.items():
        if not _apart(k, also):
            pipe.sadd(k.queues, queue)
        pipe.lpush(k.queue(queue), *raws)
    return [k.queue(queue) for queue in by_queue]


def _apart(k: Keys, also: Also | None) -> bool:
    """Whether the registry (``N:queues``) is written before the push, not
    with it: under SHARDING, a MULTI with the Tasks record holds one slot,
    its group's, and the registry is in ``{N}``."""
    return k.sharded and also is not None


def _register_apart(k: Keys, payloads: list[Payload], also: Also | None) -> tuple[str, ...]:
    """The queues to add to ``N:queues`` before the push (:func:`_apart`)."""
    return tuple({str(p["queue"]) for p in payloads}) if _apart(k, also) else ()


def _registered_now(k: Keys, payloads: list[Payload], at: float | None) -> None:
    if at is None:
        now = time.monotonic()
        for p in payloads:
            _registered[(k.namespace, p["queue"])] = now
