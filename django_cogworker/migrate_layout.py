"""The move from the one-slot layout to the sharded one (SPEC section 16).

Turning ``SHARDING`` on changes where each queue group's keys live: a
queue ``{N}:queue:<q>`` becomes ``{N:<g>}:queue`` (or ``:queue:<q>``), and
the schedule, retry, dead and unsettled sets and the in-progress lists
split by group (``docs/redis-layout.md``), and so do the limiters' waiting
lists. The shared keys (stats, processes, limiters, batches) keep their
names. :func:`migrate` moves every
job of the old layout to its group's key, entry by entry, each move
idempotent so that a migration killed at any point and run again moves
nothing twice and loses nothing:

- a list entry (a queue, unsettled, repeat_orphans, an in-progress list):
  read at the list's oldest end; pushed to its new list together with its
  digest in the group's ``migrated`` set (``migrate_push.lua``, one slot);
  taken off the old list only then. A rerun whose push finds the digest
  there only takes it off (the digests expire after ``MIGRATED_TTL_S``);
- a sorted-set entry: ``ZADD`` (idempotent by nature), then ``ZREM``;
- a limiter's waiting list: as a list, into the group of its queue, which
  notes it (``limit_waiters``) first;
- the job's unique and periodic running locks, and its orphan counter,
  follow it to its group (with what is left of their TTL) before it moves.

A job left on an in-progress list is a dead process's (no old-layout
process may be alive: :func:`live_processes` refuses): it goes back on its
queue, as recovery would put it. Old producers may go on pushing to the old
keys meanwhile; a run after the last of them stopped moves the rest.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.keys import Keys
from django_cogworker.layouts import keys
from django_cogworker.scripts import script

#: How long the digests of moved list entries are kept, for a rerun.
MIGRATED_TTL_S = 7 * 24 * 3600
SCAN_COUNT = 1000


def old_keys(new: Keys) -> Keys:
    """The one-slot layout's keys of the sharded namespace ``new``: its
    shared keys' names (``{N}``) are the same."""
    return keys("{" + new.namespace + "}")


def live_processes(client: Any, old: Keys) -> list[str]:
    """The registered processes whose presence key (in the one-slot
    layout: also their record) still exists."""
    identities = sorted(m.decode("utf-8", "surrogateescape") for m in client.smembers(old.processes))
    return [i for i in identities if client.exists(old.process(i))]


def _payload(raw: bytes) -> dict[str, Any]:
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _queue(payload: dict[str, Any]) -> str:
    queue = payload.get("queue")
    return queue if isinstance(queue, str) and queue else DEFAULT_QUEUE


class Migration:
    """One run: ``counts`` by what was moved; ``dry`` counts without moving."""

    def __init__(self, client: Any, new: Keys, *, dry: bool = False) -> None:
        self.client = client
        self.new = new
        self.old = old_keys(new)
        self.dry = dry
        self.counts: Counter[str] = Counter()

    def run(self) -> Counter[str]:
        old = self.old
        for name in self._queue_names():
            group = self.new.for_queue(name)
            self._list(old.queue(name), "queued", lambda raw, g=group, q=name: (g, g.queue(q)))
        for zset in ("schedule", "retry", "dead"):
            self._zset(getattr(old, zset), zset)
        for name in ("unsettled", "repeat_orphans"):
            self._list(getattr(old, name), name, lambda raw, n=name: self._into(raw, n))
        for key in self._scan(old.inprogress_prefix + "*"):
            # A dead process's jobs: back on their queues, as recovery would.
            self._list(key, "in progress, requeued", lambda raw: self._into(raw, ""))
        for key in self._scan(old.limit_waiting("*", "*")):
            self._waiting(key)
        return self.counts

    def _waiting(self, key: str) -> None:
        """A limiter's waiting list for a queue, to the queue's group, in
        its order; the group notes it first (``limit_waiters``), so that a
        wake finds it (docs/limits.md, Under sharding). The limiter's own
        keys are shared: they keep their names."""
        name, _, queue = key.removeprefix(self.old.limit_prefix).rpartition(":waiting:")
        group = self.new.for_queue(queue)
        spec = self.client.hget(self.old.limits, name)
        if spec is not None and not self.dry:
            self.client.hset(group.limit_waiters, f"{name}\0{queue}", spec)
        target = group.limit_waiting(name, queue)
        self._list(key, "waiting for a limiter", lambda raw: (group, target))

    def _into(self, raw: bytes, name: str) -> tuple[Keys, str]:
        """The group of the job's queue, and its list ``name`` there (its
        queue when ``name`` is empty)."""
        queue = _queue(_payload(raw))
        group = self.new.for_queue(queue)
        return group, getattr(group, name) if name else group.queue(queue)

    def _queue_names(self) -> list[str]:
        names = {m.decode("utf-8", "surrogateescape") for m in self.client.smembers(self.old.queues)}
        prefix = self.old.queue_prefix
        names |= {key.removeprefix(prefix) for key in self._scan(prefix + "*")}
        return sorted(names)

    def _scan(self, pattern: str) -> Iterator[str]:
        for key in self.client.scan_iter(match=pattern, count=SCAN_COUNT):
            yield key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key

    def _group(self, raw: bytes) -> Keys:
        return self.new.for_queue(_queue(_payload(raw)))

    def _list(self, source: str, what: str, destination: Any) -> None:
        """Moves a list's entries, oldest first; ``destination(raw)`` gives
        the group and the list an entry goes to (in that group's slot)."""
        client = self.client
        if self.dry:
            self.counts[what] += int(client.llen(source))
            return
        while (raw := client.lindex(source, -1)) is not None:
            group, target = destination(raw)
            digest = hashlib.sha1(raw).hexdigest()
            self._locks(raw)
            if script("migrate_push")(client, [target, group.migrated], [raw, digest, MIGRATED_TTL_S]):
                self.counts[what] += 1
            client.lrem(source, -1, raw)

    def _zset(self, source: str, what: str) -> None:
        client = self.client
        for raw, score in client.zscan_iter(source, count=SCAN_COUNT):
            self.counts[what] += 1
            if self.dry:
                continue
            self._locks(raw)
            client.zadd(getattr(self._group(raw), what), {raw: score})
            client.zrem(source, raw)

    def _locks(self, raw: bytes) -> None:
        """The job's unique and periodic running locks and its orphan
        counter, to its group's keys, with what is left of their TTL."""
        payload, old, group = _payload(raw), self.old, self._group(raw)
        jid = payload.get("jid")
        if not (isinstance(jid, str) and jid):
            return
        # A lock moves only when this job holds it (another job with the
        # same digest may be the holder); its orphan counter always.
        moves: list[tuple[str, str, str | None]] = [(old.orphanings(jid), group.orphanings(jid), None)]
        digest, pjid = payload.get("unique_digest"), payload.get("periodic_pjid")
        if isinstance(digest, str) and digest:
            moves.append((old.unique(digest), group.unique(digest), jid))
        if isinstance(pjid, str) and pjid:
            moves.append((old.periodic_running(pjid), group.periodic_running(pjid), jid))
        for source, target, holder in moves:
            value, ttl_ms = self.client.get(source), self.client.pttl(source)
            if value is None or (holder is not None and value != holder.encode()):
                continue
            self.client.set(target, value, px=ttl_ms if ttl_ms > 0 else None, nx=True)
            self.client.delete(source)
            self.counts["locks and counters"] += 1
