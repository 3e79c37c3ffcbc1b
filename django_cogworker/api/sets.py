"""The job sets: scheduled, retries, dead and unsettled.

Duties: ``JobSet`` is what the set pages rely on, whichever set: a size,
pages, iteration, ``filter``/``filter_page`` (by job name and queue, search
by jid or error text, by batch), ``find(jid)``, ``get(record_id)`` and ``clear()``.
``SortedSet`` implements it on a sorted set scored by time (``ScheduledSet``
and ``RetrySet``: when due; ``DeadSet``: when it died, newest first), and
filters with ZSCAN and a server-side pattern, so a set of 100,000 jobs never
comes whole into Python to show 25. ``UnsettledSet`` (``api.unsettled``)
implements it on a list. Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import abc
import heapq
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from django_cogworker.api.parsing import glob_escape, quick_match
from django_cogworker.api.records import ITERATION_BATCH, MAX_OFFSET, PAGE_SIZE, JobRecord, paged
from django_cogworker.api.scan import SCAN_COUNT, Entry, match_pattern, select_page
from django_cogworker.api.seek import SEEK_FROM, seek
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.keys import Keys
from django_cogworker.shards import groups_known


class JobSet(abc.ABC):
    """A set of stored jobs the admin lists, filters and acts on."""

    key: str
    _groups: list[Keys] | None = None

    def _spread(self, key_name: str) -> None:
        """Its key: without SHARDING the one; with it, one per queue group
        (SPEC section 16), found when first needed, as which groups there
        are is read from Redis."""
        keys = get_keys()
        self._groups = None if keys.sharded else [keys]
        self.key = f"{{{keys.namespace}:*}}:{key_name}" if keys.sharded else getattr(keys, key_name)

    @property
    def groups(self) -> list[Keys]:
        """The keys of each queue group whose entries this set merges."""
        if self._groups is None:
            self._groups = groups_known()
        return self._groups

    @property
    @abc.abstractmethod
    def size(self) -> int: ...

    @abc.abstractmethod
    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[JobRecord]: ...

    @abc.abstractmethod
    def filter(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        limit: int | None = None,
        bid: str | None = None,
    ) -> list[JobRecord]:
        """Entries matching every given criterion (``search`` looks in the
        jid and the error; ``bid``: the members and callbacks of a batch)."""

    @abc.abstractmethod
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
        """(how many match, the page at ``offset``): what a paginated list
        needs, from one pass. Past the end, no entries; with ``or_last``, the
        last page instead (at ``scan.last_page_offset(count, limit)``)."""

    @abc.abstractmethod
    def find(self, jid: str) -> JobRecord | None: ...

    @abc.abstractmethod
    def get(self, record_id: str) -> JobRecord | None:
        """The entry whose ``JobRecord.id`` is ``record_id``, or None."""

    def get_many(self, record_ids: Iterable[str]) -> list[JobRecord]:
        """The entries of these ids that are still there (a bulk action's selection)."""
        return [r for r in (self.get(i) for i in dict.fromkeys(record_ids)) if r is not None]

    @abc.abstractmethod
    def clear(self) -> int:
        """Deletes every entry; returns how many."""


class SortedSet(JobSet):
    key_name = ""
    newest_first = False

    def __init__(self) -> None:
        self._spread(self.key_name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key}>"

    def _key(self, i: int) -> str:
        return str(getattr(self.groups[i], self.key_name))

    @property
    @redis_boundary("read a job set's size")
    def size(self) -> int:
        return sum(each_key(get_redis(), "zcard", [self._key(i) for i in range(len(self.groups))]))

    def _record(self, raw: bytes, score: float, i: int = 0) -> JobRecord:
        return JobRecord(raw, source=self._key(i), kind="zset", score=float(score), home=self.groups[i])

    @redis_boundary("read a job set")
    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        if offset + limit > MAX_OFFSET:
            return []
        if len(self.groups) > 1:
            if offset <= SEEK_FROM:
                return list(itertools.islice(self._merged(), offset, offset + limit))
            starts, skip = self._seek(offset)
            return list(itertools.islice(self._merged(starts), skip, skip + limit))
        client = get_redis()
        fn = client.zrevrange if self.newest_first else client.zrange
        return [self._record(r, s) for r, s in fn(self._key(0), offset, offset + limit - 1, withscores=True)]

    def _stream(self, i: int, start: int = 0) -> Iterator[Entry]:
        """Group ``i``'s set in order from rank ``start``, ``ITERATION_BATCH``
        entries per call."""
        client = get_redis()
        fn = client.zrevrange if self.newest_first else client.zrange
        while True:
            batch = fn(self._key(i), start, start + ITERATION_BATCH - 1, withscores=True)
            yield from ((float(score), raw, i) for raw, score in batch)
            if len(batch) < ITERATION_BATCH:
                return
            start += ITERATION_BATCH

    def _merged(self, starts: list[int] | None = None) -> Iterator[JobRecord]:
        """Every group's set merged in the set's order (SPEC section 16),
        each from its rank in ``starts`` (from its first entry when None)."""
        streams = [self._stream(i, starts[i] if starts else 0) for i in range(len(self.groups))]
        for score, raw, i in heapq.merge(*streams, reverse=self.newest_first):
            yield self._record(raw, score, i)

    def _seek(self, offset: int) -> tuple[list[int], int]:
        """Where the merged page at ``offset`` starts in each group's set
        (``api.seek``): a deep page reads a page and its ties, not every
        entry before it."""
        keys = [self._key(i) for i in range(len(self.groups))]
        return seek(get_redis(), keys, offset, newest_first=self.newest_first)

    def __iter__(self) -> Iterator[JobRecord]:
        if len(self.groups) == 1:
            return paged(self.page)
        return _bounded("read a job set", self._merged())

    def _matches(
        self, name: str | None, queue: str | None, search: str | None, bid: str | None, *, exact: bool
    ) -> Iterator[Entry]:
        """(score, entry, group) of the entries that match, in ZSCAN's order:
        one pass over each group's set. ZSCAN's pattern
        (``scan.match_pattern``) narrows them on the server; ``quick_match``
        settles most of the rest from the bytes without parsing, unless
        ``exact`` (then each one it does not rule out is parsed and decided
        on its fields)."""
        pattern = match_pattern(name, queue, search, bid)
        client = get_redis()
        for i in range(len(self.groups)):
            for raw, score in client.zscan_iter(self._key(i), match=pattern, count=SCAN_COUNT):
                quick = quick_match(raw, name=name, queue=queue, search=search, bid=bid)
                if quick is False:
                    continue
                if (quick is None or exact) and not self._record(raw, score, i).matches(
                    name=name, queue=queue, search=search, bid=bid
                ):
                    continue
                yield float(score), raw, i

    @redis_boundary("search a job set")
    def filter(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        limit: int | None = None,
        bid: str | None = None,
    ) -> list[JobRecord]:
        """Entries matching every given criterion (``search`` looks in the jid
        and the error), in the set's order. One ZSCAN pass with a server-side
        pattern, so a large set is not read whole into Python; with
        ``limit``, only the first ``limit`` matches are kept meanwhile."""
        if limit is None:
            # Ties broken by the entry, as Redis orders equal scores.
            entries = sorted(self._matches(name, queue, search, bid, exact=False), reverse=self.newest_first)
            records = (self._record(raw, score, i) for score, raw, i in entries)
            return [r for r in records if r.matches(name=name, queue=queue, search=search, bid=bid)]
        matches = self._matches(name, queue, search, bid, exact=True)
        _, _, entries = select_page(
            matches, offset=0, limit=limit, descending=self.newest_first, size=self.size
        )
        return [self._record(raw, score, i) for score, raw, i in entries]

    @redis_boundary("search a job set")
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
        """(how many match, the page at ``offset``; past the end, with
        ``or_last``, the last page) from one ZSCAN pass that counts the
        matches and keeps only those that can fall in the page
        (``scan.select_page``): what a paginated list needs, without keeping
        or parsing every match of a large set. Every record returned matches
        exactly; the count may include an entry whose field sits only inside
        a nested object (a payload of the wrong shape)."""
        count, _, entries = select_page(
            self._matches(name, queue, search, bid, exact=False),
            offset=offset,
            limit=limit,
            descending=self.newest_first,
            size=self.size,
            or_last=or_last,
        )
        page = [self._record(raw, score, i) for score, raw, i in entries]
        return count, [r for r in page if r.matches(name=name, queue=queue, search=search, bid=bid)]

    @redis_boundary("find a job")
    def find(self, jid: str) -> JobRecord | None:
        pattern = f'*"jid":{glob_escape(json.dumps(jid))}*'
        for i in range(len(self.groups)):
            for raw, score in get_redis().zscan_iter(self._key(i), match=pattern, count=1000):
                record = self._record(raw, score, i)
                if record.jid == jid:
                    return record
        return None

    @redis_boundary("find a job")
    def get(self, record_id: str) -> JobRecord | None:
        """The entry whose ``JobRecord.id`` is ``record_id``, or None."""
        score_text, sep, rest = record_id.partition("~")
        jid, _, digest = rest.partition("~")
        try:
            score = float(score_text)
        except ValueError:
            return None
        if not sep or math.isnan(score):
            return None
        bound = repr(score)
        for i in range(len(self.groups)):
            for raw, s in get_redis().zrangebyscore(self._key(i), bound, bound, withscores=True):
                record = self._record(raw, s, i)
                if storable(record.jid) == jid and record.digest.startswith(digest):
                    return record
        return None

    @redis_boundary("clear a job set")
    def clear(self) -> int:
        return sum(take_all(get_redis(), "zcard", self._key(i)) for i in range(len(self.groups)))

    def job_names(self) -> list[str]:
        return sorted({r.name for r in self})


class ScheduledSet(SortedSet):
    key_name = "schedule"


class RetrySet(SortedSet):
    key_name = "retry"


class DeadSet(SortedSet):
    key_name = "dead"
    newest_first = True


_T = TypeVar("_T")


def each_key(client: Any, command: str, keys: list[str]) -> list[int]:
    """``command`` (a count: ZCARD, LLEN) on each key, in one round trip
    (per master on a cluster): a merged set's size."""
    if len(keys) == 1:
        return [int(getattr(client, command)(keys[0]))]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        getattr(pipe, command)(key)
    return [int(n) for n in pipe.execute()]


def take_all(client: Any, count: str, key: str) -> int:
    """Deletes ``key`` and returns how many entries it held (``count``:
    ZCARD, LLEN), in one MULTI: an entry added meanwhile is counted."""
    pipe = client.pipeline(transaction=True)
    getattr(pipe, count)(key)
    pipe.delete(key)
    return int(pipe.execute()[0])


def _bounded(doing: str, items: Iterator[_T]) -> Iterator[_T]:
    """``items``, with the Redis errors of reading them as ``CogworkerError``."""
    with redis_boundary(doing):
        yield from items
