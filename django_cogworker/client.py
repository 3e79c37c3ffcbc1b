"""The enqueue side: payloads to Redis, after commit when in a transaction.

``.delay()`` costs one round trip (SADD the queue name, LPUSH the payload,
pipelined). A connection error is raised to the caller as RedisUnavailable
before anything is written (SPEC section 8); a pipeline that never reached
Redis wrote nothing.

Every payload first passes the client middleware chain
(:mod:`django_cogworker.middleware`, unique locks included), which may change
it or refuse it: a refused payload is not pushed and ``.delay()`` returns
None. When the push fails, the chain is told, so that a unique lock taken for
the payload is released.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from django.db import transaction

from django_cogworker import middleware
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import EnqueueRefused, RedisUnavailable
from django_cogworker.payload import Payload, encode

#: Hook for the testing helpers' inline mode: when set, payloads are handed
#: to it instead of Redis.
inline_runner: Callable[[Payload], Any] | None = None


def enqueue(payload: Payload, at: float | None = None) -> str | None:
    chain = middleware.client_chain()
    ready = chain.run(payload, at=at)
    if ready is None:
        return None
    if inline_runner is not None:
        inline_runner(ready)
        return str(ready["jid"])
    if get_config().enqueue_on_commit:
        conn = transaction.get_connection()
        if conn.in_atomic_block:
            transaction.on_commit(lambda: _push_or_cancel(chain, [ready], at))
            return str(ready["jid"])
    _push_or_cancel(chain, [ready], at)
    return str(ready["jid"])


def enqueue_many(payloads: list[Payload], *, chunk_size: int = 1000) -> list[str]:
    """Pushes the payloads the client chain accepts; returns their jids."""
    chain = middleware.client_chain()
    payloads = [ready for ready in (chain.run(p) for p in payloads) if ready is not None]
    jids = [str(p["jid"]) for p in payloads]
    if inline_runner is not None:
        for payload in payloads:
            inline_runner(payload)
        return jids

    def push_all() -> None:
        for start in range(0, len(payloads), chunk_size):
            _push_or_cancel(chain, payloads[start : start + chunk_size], None)

    if get_config().enqueue_on_commit and transaction.get_connection().in_atomic_block:
        transaction.on_commit(push_all)
    else:
        push_all()
    return jids


def _push_or_cancel(chain: middleware.ClientChain, payloads: list[Payload], at: float | None) -> None:
    try:
        _push(payloads, at)
    except BaseException:
        for payload in payloads:
            chain.cancel(payload)
        raise


#: Queue names this process registered in ``N:queues`` lately (name ->
#: monotonic time). A ``.delay()`` to such a queue is a bare LPUSH; the name
#: is registered again after QUEUE_REGISTRATION_TTL_S in case the set was lost.
_registered: dict[tuple[str, str], float] = {}
QUEUE_REGISTRATION_TTL_S = 60.0


def _push(payloads: list[Payload], at: float | None) -> None:
    k = get_keys()
    with _translated_errors():
        if at is None and len(payloads) == 1:
            queue = payloads[0]["queue"]
            seen = _registered.get((k.namespace, queue))
            if seen is not None and time.monotonic() - seen < QUEUE_REGISTRATION_TTL_S:
                get_redis().lpush(k.queue(queue), encode(payloads[0]))
                return
        pipe = get_redis().pipeline(transaction=False)
        if at is not None:
            pipe.zadd(k.schedule, {encode(p): at for p in payloads})
        else:
            by_queue: dict[str, list[bytes]] = {}
            for p in payloads:
                by_queue.setdefault(p["queue"], []).append(encode(p))
            for queue, raws in by_queue.items():
                pipe.sadd(k.queues, queue)
                pipe.lpush(k.queue(queue), *raws)
        pipe.execute()
    if at is None:
        now = time.monotonic()
        for p in payloads:
            _registered[(k.namespace, p["queue"])] = now


@contextlib.contextmanager
def _translated_errors() -> Iterator[None]:
    """redis-py's errors, raised to the caller as ours (SPEC section 8)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"could not enqueue: Redis is unreachable ({exc})") from exc
    except redis.RedisError as exc:
        # OOM under maxmemory, a read-only replica, a key of the wrong type:
        # the caller gets our error, with the server's reason.
        raise EnqueueRefused(f"could not enqueue: Redis refused it ({exc})") from exc
