"""The filters of a set page: by job name, queue and batch, and a search
by jid or error text, read from the query string and carried in the URLs
of its pages and actions. A filtered page is one scan of the set with a
server-side pattern (the API's ``filter_page``), remembered for the
request: past the end, the paginator asks again for the last page, which
the same scan read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django_cogworker import api
from django_cogworker.api.scan import last_page_offset


@dataclass(frozen=True)
class Filters:
    name: str
    queue: str
    search: str
    #: The batch whose members (and callbacks) are listed (SPEC section 13).
    bid: str = ""
    #: Pages read in this request, by (set, offset, limit): past the end the
    #: paginator asks again for the last page, which the same scan read.
    _pages: dict[tuple[str, int, int], tuple[int, list[api.JobRecord]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, query: Any) -> Filters:
        return cls(
            query.get("name", "").strip(),
            query.get("queue", "").strip(),
            query.get("q", "").strip(),
            query.get("bid", "").strip(),
        )

    @property
    def active(self) -> bool:
        return bool(self.name or self.queue or self.search or self.bid)

    def matching(self, jobs: api.JobSet) -> list[api.JobRecord]:
        return jobs.filter(
            name=self.name or None, queue=self.queue or None, search=self.search or None, bid=self.bid or None
        )

    def page(self, jobs: api.JobSet, offset: int, limit: int) -> tuple[int, list[api.JobRecord]]:
        """(how many match, the page at ``offset`` or past the end the last), from one scan."""
        known = self._pages.get((jobs.key, offset, limit))
        if known is not None:
            return known
        count, records = jobs.filter_page(
            name=self.name or None,
            queue=self.queue or None,
            search=self.search or None,
            bid=self.bid or None,
            offset=offset,
            limit=limit,
            or_last=True,
        )
        at = offset if offset < count else last_page_offset(count, limit)
        self._pages[(jobs.key, at, limit)] = (count, records)
        return count, records

    @property
    def query(self) -> str:
        pairs = [("name", self.name), ("queue", self.queue), ("q", self.search), ("bid", self.bid)]
        return urlencode([(k, v) for k, v in pairs if v])

    def describe(self) -> str:
        parts = []
        if self.bid:
            parts.append(f"batch is {self.bid}")
        if self.name:
            parts.append(f"job name is {self.name}")
        if self.queue:
            parts.append(f"queue is {self.queue}")
        if self.search:
            parts.append(f"jid or error contains {self.search!r}")
        return " and ".join(parts)
