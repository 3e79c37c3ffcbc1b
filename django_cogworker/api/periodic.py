"""The periodic entries, as the admin's periodic page shows them.

Duties: ``PeriodicEntries()`` lists the entries this process knows
(``COGWORKER["PERIODIC"]`` and ``@periodic``, read through
``django_cogworker.periodic``), each a ``PeriodicEntry`` with when it runs
next, when any process last enqueued it, and whether an ``until_executed``
run holds its running lock (a run is queued or running). Reading is one
round trip. A last run that is not a time reads as never, noted in
``PeriodicEntries.all().skipped`` (SPEC section 8). Redis errors reach the
caller as ``CogworkerError`` (``errors.redis_boundary``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django_cogworker import periodic
from django_cogworker.api.parsing import Listing, checked_number, is_wrong_type, quoted
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary


@dataclass
class PeriodicEntry:
    pjid: str
    job: str
    cron: str
    tz: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    until_executed: bool
    next_run: dt.datetime
    last_run: dt.datetime | None  # last enqueued by any process
    running: bool  # the running lock is held: a run is queued or running

    @property
    def name(self) -> str:
        return self.job


class PeriodicEntries:
    """The periodic entries this process knows (``COGWORKER["PERIODIC"]`` and
    ``@periodic``), with when each runs next, when it was last enqueued and
    whether an ``until_executed`` run holds its running lock."""

    def __iter__(self) -> Iterator[PeriodicEntry]:
        yield from self.all()

    def __len__(self) -> int:
        return len(self.all())

    @property
    def size(self) -> int:
        return len(self.all())

    @redis_boundary("read the periodic entries")
    def all(self) -> Listing[PeriodicEntry]:
        from django_cogworker.periodic.entry import entry_queue  # loaded with the entries

        entries = periodic.entries()
        if not entries:
            return Listing()
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.hmget(k.periodic_last, [e.pjid for e in entries])
        for entry in entries:
            pipe.exists(k.periodic_running(entry.pjid))
        last, *running = pipe.execute(raise_on_error=False)
        skipped: list[str] = []
        if is_wrong_type(last):
            skipped.append(f"{k.periodic_last} is not a hash: no last run is shown")
            last = [None] * len(entries)
        now = time.time()
        records = []
        for entry, last_at, held in zip(entries, last, running, strict=True):
            last_run = _last_run(k.periodic_last, entry.pjid, last_at, skipped)
            records.append(
                PeriodicEntry(
                    pjid=entry.pjid,
                    job=entry.job,
                    cron=entry.cron,
                    tz=entry.tz,
                    queue=entry_queue(entry),
                    args=list(entry.args),
                    kwargs=dict(entry.kwargs),
                    until_executed=entry.until_executed,
                    next_run=dt.datetime.fromtimestamp(entry.schedule.next_run(now), tz=dt.UTC),
                    last_run=last_run,
                    running=bool(held),
                )
            )
        return Listing(records, skipped)

    def find(self, pjid: str) -> PeriodicEntry | None:
        return next((e for e in self.all() if e.pjid == pjid), None)


def _last_run(key: str, pjid: str, raw: bytes | None, skipped: list[str]) -> dt.datetime | None:
    """When an entry was last enqueued, from its field of ``key``; None when
    never, or when the field is not a time (then noted in ``skipped``)."""
    if raw is None:
        return None
    at, why = checked_number(raw, float)
    if not why:
        try:
            return dt.datetime.fromtimestamp(at, tz=dt.UTC)
        except (ValueError, OverflowError, OSError):
            why = f"{quoted(raw)} is not a time"
    skipped.append(f"{key} {pjid}: {why}: shown as never run")
    return None
