"""The unsettled list: failed jobs a stopping process could not file in
retry or dead, which any live process files (``settle.py``).

Duties: ``UnsettledSet`` is a ``JobSet`` on that list (usually a few
entries): each entry wraps the payload with the set it should go to and
its score; filtering reads the list whole. Redis errors reach the caller as
``CogworkerError`` (``errors.redis_boundary``).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator

from django_cogworker.api.parsing import loads_object
from django_cogworker.api.records import MAX_OFFSET, PAGE_SIZE, JobRecord
from django_cogworker.api.scan import last_page_offset
from django_cogworker.api.sets import JobSet, each_key, take_all
from django_cogworker.connection import get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.escaping import utf8
from django_cogworker.keys import Keys


class UnsettledSet(JobSet):
    """Failed jobs a stopping process could not file; any live process files them."""

    def __init__(self) -> None:
        self._spread("unsettled")  # under SHARDING one list per group, read one after the other

    @property
    @redis_boundary("read the unsettled jobs")
    def size(self) -> int:
        return sum(each_key(get_redis(), "llen", [g.unsettled for g in self.groups]))

    def _record(self, raw: bytes, home: Keys) -> JobRecord:
        entry = loads_object(raw) or {}
        payload = entry.get("payload")
        payload_raw = utf8(payload) if isinstance(payload, str) else raw
        score = entry.get("score")
        return JobRecord(
            raw,
            source=home.unsettled,
            home=home,
            kind="unsettled",
            payload_raw=payload_raw,
            score=float(score) if isinstance(score, int | float) else None,
            target_set=entry.get("set"),
        )

    @redis_boundary("read the unsettled jobs")
    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        if offset + limit > MAX_OFFSET:
            return []
        if len(self.groups) > 1:
            return list(itertools.islice(self, offset, offset + limit))
        home = self.groups[0]
        return [self._record(r, home) for r in get_redis().lrange(home.unsettled, offset, offset + limit - 1)]

    def __iter__(self) -> Iterator[JobRecord]:
        for home in self.groups:
            with redis_boundary("read the unsettled jobs"):
                raws = get_redis().lrange(home.unsettled, 0, -1)
            for raw in raws:
                yield self._record(raw, home)

    def filter(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        limit: int | None = None,
        bid: str | None = None,
    ) -> list[JobRecord]:
        found = [r for r in self if r.matches(name=name, queue=queue, search=search, bid=bid)]
        return found[:limit] if limit is not None else found

    def filter_page(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        offset: int = 0,
        limit: int = PAGE_SIZE,
        or_last: bool = False,
        bid: str | None = None,
    ) -> tuple[int, list[JobRecord]]:
        """(how many match, the page at ``offset``), as ``SortedSet.filter_page``:
        one pass over the list, keeping the page's matches and, with
        ``or_last``, the last ``limit`` (the last page, if ``offset`` is past it)."""
        count, page, last = 0, [], deque[JobRecord](maxlen=limit if or_last else 0)
        for record in self:
            if record.matches(name=name, queue=queue, search=search, bid=bid):
                if offset <= count < offset + limit:
                    page.append(record)
                last.append(record)
                count += 1
        if or_last and 0 < count <= offset:
            return count, list(last)[len(last) - (count - last_page_offset(count, limit)) :]
        return count, page

    def find(self, jid: str) -> JobRecord | None:
        return next((r for r in self if r.jid == jid), None)

    def get(self, record_id: str) -> JobRecord | None:
        """The entry whose ``JobRecord.id`` is ``record_id``, or None."""
        return next(iter(self.get_many([record_id])), None)

    def get_many(self, record_ids: Iterable[str]) -> list[JobRecord]:
        """One pass over the list for all of them (not one per id)."""
        wanted = set(record_ids)
        found: dict[str, JobRecord] = {}
        for record in self:
            if record.id in wanted and record.id not in found:
                found[record.id] = record
        return list(found.values())

    @redis_boundary("clear the unsettled jobs")
    def clear(self) -> int:
        return sum(take_all(get_redis(), "llen", g.unsettled) for g in self.groups)
