"""The queues: what waits to run, and pausing.

Duties: ``Queue(name)`` reads a queue's size, latency (how long its oldest
job has waited) and jobs in the order they will run; pauses and unpauses it
(a paused queue is skipped by every worker's fetch) and clears it.
``Queue.all()`` lists every queue known in ``N:queues``, empty ones too.
Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from django_cogworker.api.parsing import loads_object
from django_cogworker.api.records import PAGE_SIZE, JobRecord, paged
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary


class Queue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.key = get_keys().queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name}>"

    @classmethod
    @redis_boundary("list the queues")
    def all(cls) -> list[Queue]:
        names = {m.decode() for m in get_redis().smembers(get_keys().queues)}
        return [cls(n) for n in sorted(names)]

    @property
    @redis_boundary("read a queue's size")
    def size(self) -> int:
        return int(get_redis().llen(self.key))

    @property
    @redis_boundary("read a queue's latency")
    def latency(self) -> float:
        """Seconds the oldest job has waited (0 when empty)."""
        oldest = get_redis().lindex(self.key, -1)
        if oldest is None:
            return 0.0
        payload = loads_object(oldest) or {}
        at = payload.get("enqueued_at")
        return max(0.0, time.time() - float(at)) if isinstance(at, int | float) else 0.0

    @property
    @redis_boundary("read whether a queue is paused")
    def paused(self) -> bool:
        return bool(get_redis().sismember(get_keys().paused, self.name))

    @redis_boundary("pause a queue")
    def pause(self) -> None:
        get_redis().sadd(get_keys().paused, self.name)

    @redis_boundary("unpause a queue")
    def unpause(self) -> None:
        get_redis().srem(get_keys().paused, self.name)

    @redis_boundary("clear a queue")
    def clear(self) -> int:
        """Deletes every job in the queue; returns how many. The queue stays
        known (listed by ``Queue.all()``, with size 0)."""
        pipe = get_redis().pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])

    @redis_boundary("read a queue's jobs")
    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        """Jobs in the order they will run (next first)."""
        end = -1 - offset
        start = end - limit + 1
        raws = get_redis().lrange(self.key, start, end)
        return [JobRecord(r, source=self.key, kind="queue") for r in reversed(raws)]

    def __iter__(self) -> Iterator[JobRecord]:
        return paged(self.page)

    def find(self, jid: str) -> JobRecord | None:
        return next((r for r in self if r.jid == jid), None)
