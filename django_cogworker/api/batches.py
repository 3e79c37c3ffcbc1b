"""Batches (SPEC section 13) as operators and the admin see them.

Duties: ``Batch(bid)`` reads one batch's figures (``batch_figures``): its
description, kind, parent, creation time, total, pending (not yet
succeeded nor dead, the members waiting for a retry included), succeeded,
dead, the callbacks with the time each fired, and whether it settled;
``pending_jids()`` and ``dead_jids()`` name some of its members;
``retry_dead()`` retries its dead members; ``delete()`` removes its keys
and its index entry. ``BatchSet()`` lists
the batches of the index ``N:batches``, newest first, skipping those whose
keys expired; ``page(state=...)`` lists the open ones first.
``batch_metrics()`` reads, in one round trip, what the Prometheus endpoint
exposes: the open batches and the callbacks enqueued, by event.

Whatever Redis holds is data: a member that is not UTF-8 or an index entry
that is no batch id is skipped with a note, a key of the wrong type reads
as empty (SPEC section 8). Redis errors reach the caller as
``CogworkerError`` (``errors.redis_boundary``); an unknown bid as
``BatchNotFound``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from django_cogworker.api.actions import bulk
from django_cogworker.api.batch_figures import OPEN_SENTINEL, BatchFigures, batch_figures
from django_cogworker.api.parsing import Listing, checked_number, is_wrong_type, unless_wrong_type
from django_cogworker.api.records import PAGE_SIZE
from django_cogworker.api.sets import DeadSet
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import BatchNotFound, redis_boundary

#: Index entries read per round trip when listing.
INDEX_PAGE = 500

#: The longest bid accepted (ours are 22 characters).
MAX_BID_CHARS = 200


@redis_boundary("read the batches' figures")
def batch_metrics() -> tuple[int, dict[str, int]]:
    """(open batches, callbacks enqueued so far by event, every event named):
    ``N:batches:open`` and ``N:stat:batch_callbacks``, which the scripts
    that open and settle batches and fire their callbacks keep. A key of
    the wrong type, or a count that is no number, reads as 0."""
    from django_cogworker.workflows.batch import EVENTS

    k = get_keys()
    pipe = get_redis().pipeline(transaction=False)
    pipe.zcard(k.batches_open)
    pipe.hgetall(k.stat_batch_callbacks)
    opened, fired = pipe.execute(raise_on_error=False)
    opened = 0 if is_wrong_type(opened) else int(opened)
    fired = {} if is_wrong_type(fired) else fired
    return opened, {event: checked_number(fired.get(event.encode()), int)[0] for event in EVENTS}


def check_bid(bid: str) -> str:
    """``bid`` if a key can be built from it; else ``BatchNotFound``."""
    if not isinstance(bid, str):
        raise TypeError(f"a batch id is a str, not {type(bid).__name__}")
    printable = bid.isprintable() and not any(0xD800 <= ord(c) <= 0xDFFF for c in bid)
    if not bid or len(bid) > MAX_BID_CHARS or not printable or bid != bid.strip():
        raise BatchNotFound(f"{bid[:MAX_BID_CHARS]!r} is not a batch id: no batch has it")
    return bid


class Batch:
    """One batch, by id; ``BatchNotFound`` when Redis holds none of that id.
    Each figure is read when asked for (``figures()`` reads them all at once)."""

    def __init__(self, bid: str) -> None:
        self.bid = check_bid(bid)
        self.figures()

    def __repr__(self) -> str:
        return f"<Batch {self.bid}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Batch) and other.bid == self.bid

    def __hash__(self) -> int:
        return hash(self.bid)

    def figures(self) -> BatchFigures:
        found = batch_figures([self.bid])[0]
        if found is None:
            raise BatchNotFound(f"no batch {self.bid!r} in Redis: it never existed, expired or was deleted")
        return found

    total = property(lambda self: self.figures().total)
    pending = property(lambda self: self.figures().pending)
    failed = property(lambda self: self.figures().failed)
    succeeded = property(lambda self: self.figures().succeeded)
    dead = property(lambda self: self.figures().dead)
    settled = property(lambda self: self.figures().settled)
    fired = property(lambda self: self.figures().fired)
    description = property(lambda self: self.figures().description)
    created_at = property(lambda self: self.figures().created_at)
    callbacks = property(lambda self: self.figures().callbacks)

    def pending_jids(self, limit: int = PAGE_SIZE) -> Listing[str]:
        """Up to ``limit`` members not yet succeeded nor dead, by jid (a
        child batch as ``b:<bid>``)."""
        return self._members(("pending", "failed"), limit)

    def dead_jids(self, limit: int = PAGE_SIZE) -> Listing[str]:
        """Up to ``limit`` dead members, by jid."""
        return self._members(("dead",), limit)

    @redis_boundary("read a batch's members")
    def _members(self, parts: tuple[str, ...], limit: int) -> Listing[str]:
        client, k = get_redis(), get_keys()
        found: set[str] = set()
        skipped: list[str] = []
        for part in parts:
            key = k.batch(self.bid, part)
            try:
                members = client.sscan_iter(key, count=1000)
                for member in members:
                    if len(found) >= limit:
                        break
                    try:
                        jid = member.decode()
                    except UnicodeDecodeError:
                        skipped.append(f"a member of {key} is not UTF-8 text ({member!r}): skipped")
                        continue
                    if jid != OPEN_SENTINEL:
                        found.add(jid)
            except Exception as exc:
                if not is_wrong_type(exc):
                    raise
                skipped.append(f"{key} is not a set: its members are not listed")
        return Listing(sorted(found), skipped)

    def retry_dead(self) -> int:
        """Puts the batch's dead members that are in the dead set back on
        their queues (``JobRecord.retry``, which counts each live again in
        its batch, in the same script, while the batch has not settled;
        after, they run as plain jobs); its callbacks stay where they are.
        Returns how many were retried."""
        members = [r for r in DeadSet().filter(bid=self.bid) if "cb" not in r.payload]
        return bulk(members, "retry")

    @redis_boundary("delete a batch")
    def delete(self) -> bool:
        """Removes the batch's keys and its index entry: its callbacks will
        never fire; its members that are still queued run as plain jobs
        whose completion finds no batch. True if there was one."""
        k = get_keys()
        pipe = get_redis().pipeline(transaction=False)
        pipe.delete(*k.batch_keys(self.bid))
        pipe.zrem(k.batches, self.bid)
        pipe.zrem(k.batches_open, self.bid)
        deleted, _, _ = pipe.execute()
        return bool(deleted)


class BatchSet:
    """The batches of the index ``N:batches``, newest first; one whose keys
    expired is skipped (the poller trims its index entry later)."""

    def __init__(self) -> None:
        self.key = get_keys().batches

    def __repr__(self) -> str:
        return f"<BatchSet {self.key}>"

    @property
    @redis_boundary("count the batches")
    def size(self) -> int:
        """Entries in the index, expired batches not yet trimmed included."""
        return int(get_redis().zcard(self.key))

    def __iter__(self) -> Iterator[BatchFigures]:
        for chunk in self._index():
            yield from (f for f in batch_figures(bid for bid, _ in chunk) if f is not None)

    def _index(self, skipped: list[str] | None = None) -> Iterator[list[tuple[str, float]]]:
        """The index newest first, ``INDEX_PAGE`` entries per round trip,
        as (bid, created_at); an entry that is no bid, noted in ``skipped``."""
        client = get_redis()
        offset = 0
        while True:
            end = offset + INDEX_PAGE - 1
            # In the body: a decorator covers a generator's creation only.
            with redis_boundary("read the batch index"):
                read = functools.partial(client.zrevrange, self.key, offset, end, withscores=True)
                raws = unless_wrong_type(read, None)
            if raws is None:
                if skipped is not None:
                    skipped.append(f"{self.key} is not a sorted set: no batch is listed")
                return
            chunk = []
            for raw, score in raws:
                try:
                    chunk.append((check_bid(raw.decode()), float(score)))
                except (UnicodeDecodeError, BatchNotFound):
                    if skipped is not None:
                        skipped.append(f"{self.key} holds {raw[:80]!r}, which is no batch id: skipped")
            yield chunk
            if len(raws) < INDEX_PAGE:
                return
            offset += INDEX_PAGE

    @redis_boundary("list the batches")
    def page(
        self, offset: int = 0, limit: int = PAGE_SIZE, *, state: str | None = None
    ) -> tuple[int, Listing[BatchFigures]]:
        """(how many batches, the page at ``offset``): open ones first, then
        settled ones, each newest first; with ``state`` ("open" or
        "settled") only those. Reads each batch's state in the index (one
        round trip per ``INDEX_PAGE`` of them, the index being bounded by
        ``BATCH_TTL``), then the page's figures."""
        if state not in (None, "open", "settled"):
            raise ValueError(f"unknown batch state {state!r}: use 'open' or 'settled'")
        skipped: list[str] = []
        opened, settled = self._by_state(skipped)
        listed = {None: opened + settled, "open": opened, "settled": settled}[state]
        window = listed[max(0, offset) : max(0, offset) + max(0, limit)]
        found = [f for f in batch_figures(window) if f is not None]
        return len(listed), Listing(found, skipped)

    def _by_state(self, skipped: list[str]) -> tuple[list[str], list[str]]:
        """(open bids, settled bids), each newest first; gone ones left out."""
        client, k = get_redis(), get_keys()
        opened: list[str] = []
        settled: list[str] = []
        for chunk in self._index(skipped):
            pipe = client.pipeline(transaction=False)
            for bid, _ in chunk:
                pipe.exists(k.batch(bid))
                pipe.hmget(k.batch(bid), "settled_at", "fired:settled")
            replies = pipe.execute(raise_on_error=False)
            for i, (bid, _) in enumerate(chunk):
                exists, marks = replies[2 * i : 2 * i + 2]
                if not exists:
                    continue
                done = not is_wrong_type(marks) and any(m is not None for m in marks)
                (settled if done else opened).append(bid)
        return opened, settled
