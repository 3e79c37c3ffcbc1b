"""Totals and daily history.

Duties: ``Stats()`` reads, in two round trips, the processed and failed
totals (flushed by each process's heartbeat: truthful to one beat), the
sizes of the schedule, retry, dead and unsettled sets, and of every known
queue; ``Stats.history(days)`` the processed and failed counts of each of
the last days (UTC). Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import datetime as dt

from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary


class Stats:
    """Totals (flushed by each process's heartbeat: truthful to one beat)."""

    @redis_boundary("read the totals")
    def __init__(self) -> None:
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.get(k.stat_processed)
        pipe.get(k.stat_failed)
        pipe.zcard(k.schedule)
        pipe.zcard(k.retry)
        pipe.zcard(k.dead)
        pipe.llen(k.unsettled)
        pipe.smembers(k.queues)
        processed, failed, scheduled, retry, dead, unsettled, queues = pipe.execute()
        self.processed = int(processed or 0)
        self.failed = int(failed or 0)
        self.scheduled_size = int(scheduled)
        self.retry_size = int(retry)
        self.dead_size = int(dead)
        self.unsettled_size = int(unsettled)
        names = sorted(q.decode() for q in queues)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(k.queue(name))
        self.queue_sizes = dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
        self.enqueued = sum(self.queue_sizes.values())

    @staticmethod
    @redis_boundary("read the daily history")
    def history(days: int = 30, *, today: dt.date | None = None) -> list[tuple[dt.date, int, int]]:
        """(day, processed, failed) for the last ``days`` days, oldest first (UTC)."""
        client, k = get_redis(), get_keys()
        today = today or dt.datetime.now(dt.UTC).date()
        dates = [today - dt.timedelta(days=i) for i in range(days - 1, -1, -1)]
        pipe = client.pipeline(transaction=False)
        for day in dates:
            pipe.get(k.stat_processed_on(day.isoformat()))
            pipe.get(k.stat_failed_on(day.isoformat()))
        values = pipe.execute()
        return [(day, int(values[2 * i] or 0), int(values[2 * i + 1] or 0)) for i, day in enumerate(dates)]
