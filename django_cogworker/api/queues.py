"""The queues: what waits to run, and pausing.

Duties: ``Queue(name)`` reads a queue's size, latency (how long its oldest
job has waited) and jobs in the order they will run; pauses and unpauses it
(a paused queue is skipped by every worker's fetch) and clears it.
``Queue.all()`` lists every known queue: those in ``N:queues`` (empty ones
too) and those the ``QUEUES`` setting names, before their first job, so
that they can be paused in advance. A malformed record (a member of
``N:queues`` that is not UTF-8, ``N:paused`` or a queue of the wrong type,
a job time that is not finite) is skipped or read as a default, with a
note in ``Queue.all().skipped``: never an exception (SPEC section 8).
``queue_figures()`` reads the size, latency and paused flag of many queues
in one round trip (the Queues page, the metrics endpoint, the status
command).
Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from django_cogworker.api.actions import bulk
from django_cogworker.api.parsing import (
    Listing,
    is_wrong_type,
    loads_object,
    names_in,
    number,
    unless_wrong_type,
)
from django_cogworker.api.records import MAX_OFFSET, PAGE_SIZE, JobRecord, paged
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary

#: How long a queue set aside by ``Queue.clear()`` is kept if the clear is
#: cut short (it is deleted at the end of the clear).
CLEARING_TTL_S = 3600

#: Entries of a queue being cleared read per round trip.
_CLEAR_CHUNK = 1000


def wait_s(oldest: Any, now: float) -> float:
    """How long the job ``oldest`` (a queue's last entry, or None) has waited:
    0 when there is none, or when its ``enqueued_at`` is not a finite time."""
    if oldest is None:
        return 0.0
    at = (loads_object(oldest) or {}).get("enqueued_at")
    if isinstance(at, bool) or not isinstance(at, int | float):
        return 0.0
    # -1e400 reads as -inf, a 400-digit integer as no float at all: both
    # read as 0 (malformed), as a wait of forever would tell nothing.
    at_s = number(at, float)
    return max(0.0, now - at_s) if at_s else 0.0


@dataclass(frozen=True)
class QueueFigures:
    name: str
    size: int
    #: How long its oldest job has waited (s); 0 when empty.
    latency_s: float
    paused: bool


class Queue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.key = get_keys().queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name}>"

    @classmethod
    @redis_boundary("list the queues")
    def all(cls) -> Listing[Queue]:
        """Every known queue by name: in ``N:queues`` or named by ``QUEUES``
        (without its ",weight")."""
        k = get_keys()
        pipe = get_redis().pipeline(transaction=False)
        pipe.smembers(k.queues)
        pipe.type(k.paused)
        members, paused_type = pipe.execute(raise_on_error=False)
        skipped: list[str] = []
        names = set(names_in(k.queues, members, skipped))
        names.update(spec.name for spec in get_config().queues)
        if is_wrong_type(paused_type) or _text(paused_type) not in ("set", "none"):
            skipped.append(
                f"{k.paused} is not a set: no queue shows as paused, and pausing fails until that key "
                "is deleted"
            )
        return Listing([cls(n) for n in sorted(names)], skipped)

    @property
    @redis_boundary("read a queue's size")
    def size(self) -> int:
        # Not a list: 0 (``Stats`` notes it).
        return int(unless_wrong_type(lambda: get_redis().llen(self.key), 0))

    @property
    @redis_boundary("read a queue's latency")
    def latency(self) -> float:
        """Seconds the oldest job has waited (0 when empty, or when its
        ``enqueued_at`` is not a finite time)."""
        return wait_s(unless_wrong_type(lambda: get_redis().lindex(self.key, -1), None), time.time())

    @property
    @redis_boundary("read whether a queue is paused")
    def paused(self) -> bool:
        # N:paused not a set: not paused (``Queue.all()`` notes it).
        return bool(unless_wrong_type(lambda: get_redis().sismember(get_keys().paused, self.name), False))

    @redis_boundary("pause a queue")
    def pause(self) -> None:
        get_redis().sadd(get_keys().paused, self.name)

    @redis_boundary("unpause a queue")
    def unpause(self) -> None:
        get_redis().srem(get_keys().paused, self.name)

    @redis_boundary("clear a queue")
    def clear(self) -> int:
        """Deletes every job in the queue; returns how many. The queue stays
        known (listed by ``Queue.all()``, with size 0). A batch's member
        deleted so counts as dead in its batch (SPEC section 13), as one
        deleted by itself: the queue is first set aside in one step
        (``RENAME``: a job pushed meanwhile stays queued), its members are
        deleted one by one through the move script, then the rest at once."""
        client, k = get_redis(), get_keys()
        if client.type(self.key) != b"list":
            # Nothing, or a key of the wrong type: deleted whole, as ever.
            pipe = client.pipeline(transaction=True)
            pipe.llen(self.key)
            pipe.delete(self.key)
            return int(pipe.execute()[0])
        aside = k.queue_clearing(self.name, secrets.token_hex(8))
        try:
            client.rename(self.key, aside)
        except redis.ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            return 0  # emptied (fetched) since the TYPE
        # A clear cut short (a lost connection) leaves no key for ever.
        client.expire(aside, CLEARING_TTL_S)
        size = int(client.llen(aside))
        members = []
        for start in range(0, size, _CLEAR_CHUNK):
            for raw in client.lrange(aside, start, start + _CLEAR_CHUNK - 1):
                if b'"bid"' in raw:
                    record = JobRecord(raw, source=aside, kind="queue", home=k.for_queue(self.name))
                    if record.bid:
                        members.append(record)
        bulk(members, "delete")
        client.delete(aside)
        return size

    @redis_boundary("read a queue's jobs")
    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        """Jobs in the order they will run (next first)."""
        if offset + limit > MAX_OFFSET:
            return []
        end = -1 - offset
        start = end - limit + 1
        raws: list[bytes] = unless_wrong_type(lambda: get_redis().lrange(self.key, start, end), [])
        home = get_keys().for_queue(self.name)
        return [JobRecord(r, source=self.key, kind="queue", home=home) for r in reversed(raws)]

    def __iter__(self) -> Iterator[JobRecord]:
        return paged(self.page)

    def find(self, jid: str) -> JobRecord | None:
        return next((r for r in self if r.jid == jid), None)


def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


@redis_boundary("read the queues' sizes and latencies")
def queue_figures(queues: Iterable[Queue], *, now: float | None = None) -> list[QueueFigures]:
    """Size, latency and paused flag of each of ``queues``, in one pipelined
    round trip: ``Queue.size``, ``.latency`` and ``.paused`` alike."""
    queues = list(queues)
    paused_key = get_keys().paused
    pipe = get_redis().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue.key)
        pipe.lindex(queue.key, -1)
        pipe.sismember(paused_key, queue.name)
    replies = pipe.execute(raise_on_error=False)
    now = time.time() if now is None else now
    out = []
    for i, queue in enumerate(queues):
        size, oldest, paused = replies[3 * i : 3 * i + 3]
        # A key of the wrong type reads as empty, not paused (``Queue.all()``
        # notes it); any other error is raised.
        size = 0 if is_wrong_type(size) else int(size)
        oldest = None if is_wrong_type(oldest) else oldest
        paused = False if is_wrong_type(paused) else bool(paused)
        out.append(QueueFigures(queue.name, size, wait_s(oldest, now), paused))
    return out
