"""Totals and daily history.

Duties: ``Stats()`` reads, in two round trips, the processed and failed
totals (flushed by each process's heartbeat: truthful to one beat), the
expired total and its counts by job name, the sizes of the schedule, retry,
dead and unsettled sets and of the batch index (SPEC section 13), and of
every known queue; ``Stats.history(days)`` the processed and failed counts of each of the last days (UTC);
``Stats.per_minute()`` those of each of the last 60 minutes, in one MGET.
A counter that is not a number, or a key of the wrong type, counts 0 and is
noted (``malformed``, ``skipped``): never an exception (SPEC section 8).
Redis errors reach the caller as ``CogworkerError`` (``errors.redis_boundary``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django_cogworker import connection
from django_cogworker.api.parsing import Listing, checked_number, is_wrong_type, names_in, number
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.keys import MINUTE_FORMAT
from django_cogworker.shards import known_groups


def _count(key: str, reply: Any, notes: list[str]) -> int:
    """A counter's GET reply; 0, noted, when it is not a count."""
    if is_wrong_type(reply):
        notes.append(f"{key} is not a string (a counter): counted as 0")
        return 0
    value, why = checked_number(reply, int)
    if why:
        notes.append(f"{key}: {why}")
    return int(value)


def _counts(key: str, reply: Any, skipped: list[str]) -> dict[str, int]:
    """A hash of counts by name (HGETALL reply); what is not one, noted and left out."""
    if is_wrong_type(reply):
        skipped.append(f"{key} is not a hash: its counts are not shown")
        return {}
    counts: dict[str, int] = {}
    for name, raw in reply.items():
        value, why = checked_number(raw, int)
        if why:
            skipped.append(f"{key}: {why}")
        else:
            counts[name.decode("utf-8", "replace")] = int(value)
    return counts


#: The figures of ``Stats``, in the order they are unpacked.
FIGURES = (
    "processed",
    "failed",
    "scheduled_size",
    "retry_size",
    "dead_size",
    "unsettled_size",
    "batches_size",
    "expired",
)


class Stats:
    """Totals (flushed by each process's heartbeat: truthful to one beat).

    ``malformed`` names each figure that was read as 0 because its key is
    malformed (figure -> why); ``skipped``, the queues not counted."""

    @redis_boundary("read the totals")
    def __init__(self) -> None:
        client, k = get_redis(), get_keys()
        # Under SHARDING each group has its own sets: their sizes are summed.
        groups = known_groups(client, k)
        pipe = client.pipeline(transaction=False)
        pipe.get(k.stat_processed)
        pipe.get(k.stat_failed)
        for g in groups:
            pipe.zcard(g.schedule)
            pipe.zcard(g.retry)
            pipe.zcard(g.dead)
            pipe.llen(g.unsettled)
        pipe.zcard(k.batches)
        pipe.get(k.stat_expired)
        pipe.hgetall(k.stat_expired_jobs)
        pipe.smembers(k.queues)
        *replies, expired_jobs, queues = pipe.execute(raise_on_error=False)
        self.malformed: dict[str, str] = {}
        self.skipped: list[str] = []
        figures = [("processed", k.stat_processed, ""), ("failed", k.stat_failed, "")]
        for g in groups:
            figures += [
                ("scheduled_size", g.schedule, "sorted set"),
                ("retry_size", g.retry, "sorted set"),
                ("dead_size", g.dead, "sorted set"),
                ("unsettled_size", g.unsettled, "list"),
            ]
        figures += [("batches_size", k.batches, "sorted set"), ("expired", k.stat_expired, "")]
        totals: dict[str, int] = {}
        for (figure, key, kind), reply in zip(figures, replies, strict=True):
            notes: list[str] = []
            if not kind:
                value = _count(key, reply, notes)
            elif is_wrong_type(reply):
                value = 0
                notes.append(f"{key} is not a {kind}")
            else:
                value = int(reply)
            totals[figure] = totals.get(figure, 0) + value
            if notes:
                self.malformed.setdefault(figure, notes[0])
        values = [totals[f] for f in FIGURES]
        (
            self.processed,
            self.failed,
            self.scheduled_size,
            self.retry_size,
            self.dead_size,
            self.unsettled_size,
            self.batches_size,
            self.expired,
        ) = values
        #: Expired jobs (``expires``) by job name; a count that is not one is left out.
        self.expired_by_job = _counts(k.stat_expired_jobs, expired_jobs, self.skipped)
        names = names_in(k.queues, queues, self.skipped)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(k.queue(name))
        self.queue_sizes: dict[str, int] = {}
        for name, size in zip(names, pipe.execute(raise_on_error=False), strict=True):
            if is_wrong_type(size):
                self.skipped.append(f"{k.queue(name)} is not a list: its jobs are not counted")
            self.queue_sizes[name] = 0 if isinstance(size, Exception) else int(size)
        self.enqueued = sum(self.queue_sizes.values())

    @staticmethod
    @redis_boundary("read the daily history")
    def history(days: int = 30, *, today: dt.date | None = None) -> Listing[tuple[dt.date, int, int]]:
        """(day, processed, failed) for the last ``days`` days, oldest first
        (UTC); a day's counter that is not a count is 0, noted in ``skipped``."""
        client, k = get_redis(), get_keys()
        today = today or dt.datetime.now(dt.UTC).date()
        dates = [today - dt.timedelta(days=i) for i in range(days - 1, -1, -1)]
        keys = [f(day.isoformat()) for day in dates for f in (k.stat_processed_on, k.stat_failed_on)]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        values = pipe.execute(raise_on_error=False)
        skipped: list[str] = []
        counts = [_count(key, value, skipped) for key, value in zip(keys, values, strict=True)]
        return Listing([(day, counts[2 * i], counts[2 * i + 1]) for i, day in enumerate(dates)], skipped)

    @staticmethod
    @redis_boundary("read the last hour")
    def per_minute(
        minutes: int = 60, *, now: dt.datetime | None = None
    ) -> list[tuple[dt.datetime, int, int]]:
        """(minute, processed, failed) for the last ``minutes`` minutes, the
        current one included, oldest first (UTC, each minute's start). A
        worker's jobs are in the minute of the heartbeat that carried them
        (``stats.py``). A missing minute counts 0, and so does a counter that
        is not a count (text, a key of another type: MGET reads those as nil)."""
        if minutes <= 0:
            return []
        client, k = get_redis(), get_keys()
        last = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).replace(second=0, microsecond=0)
        starts = [last - dt.timedelta(minutes=i) for i in range(minutes - 1, -1, -1)]
        names = [m.strftime(MINUTE_FORMAT) for m in starts]
        values = client.mget(
            [k.stat_processed_minute(n) for n in names] + [k.stat_failed_minute(n) for n in names]
        )
        counts = [max(0, number(raw, int)) for raw in values]
        return [(m, counts[i], counts[minutes + i]) for i, m in enumerate(starts)]


@dataclasses.dataclass(frozen=True)
class Memory:
    """Redis's memory: ``used_bytes`` and ``maxmemory_bytes`` (0: no
    limit). ``full``: at its maxmemory, where it refuses new jobs (SPEC
    section 8) while workers drain it."""

    used_bytes: int
    maxmemory_bytes: int

    @property
    def full(self) -> bool:
        return 0 < self.maxmemory_bytes <= self.used_bytes


def memory() -> Memory | None:
    """Redis's :class:`Memory`, or None when INFO cannot be read (an ACL)."""
    figures = connection.memory(get_redis())
    return None if figures is None else Memory(*figures)
