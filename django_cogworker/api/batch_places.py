"""Where a batch's pending members are now (SPEC section 13: the admin's
page of a batch links each to it).

Duties: ``places(bid, jids)`` finds each member among the places a job can
be: running on a process (its beat's ``N:workers`` record), the retry,
schedule and dead sets and the unsettled list (each scanned once for the
batch's entries: its payloads carry ``"bid"``, which ZSCAN's pattern
narrows on the server), a queue (read from the end that runs next, at most
``QUEUE_SCAN_ENTRIES`` entries of each), or a child batch (``b:<bid>``).
A member found nowhere is ``unknown``: moving between two places at the
moment of the reads, waiting for a limiter, or further down a long queue.
Read only; Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from django_cogworker.api.batch_figures import CHILD_PREFIX
from django_cogworker.api.parsing import field_text, unless_wrong_type
from django_cogworker.api.processes import Workers
from django_cogworker.api.queues import Queue
from django_cogworker.api.records import JobRecord
from django_cogworker.api.sets import DeadSet, RetrySet, ScheduledSet
from django_cogworker.api.unsettled import UnsettledSet
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary

#: Entries of each queue read, at most, looking for a batch's members: from
#: the end that runs next, 1,000 per round trip. A member further down a
#: longer queue is shown as unknown rather than reading the whole queue.
QUEUE_SCAN_ENTRIES = 10_000

_QUEUE_CHUNK = 1000


@dataclass(frozen=True)
class Place:
    jid: str
    #: "running", "queue", "retry", "scheduled", "dead", "unsettled",
    #: "batch" (a child batch) or "unknown".
    kind: str
    #: The process (running), the queue, or the child batch's id; "" otherwise.
    where: str = ""
    #: The entry, where it is one of a set or a queue.
    record: JobRecord | None = None


@redis_boundary("find a batch's members")
def places(bid: str, jids: Iterable[str]) -> list[Place]:
    """The place of each of ``jids`` (members of batch ``bid``), in their order."""
    jids = list(dict.fromkeys(jids))
    found: dict[str, Place] = {}
    for jid in jids:
        if jid.startswith(CHILD_PREFIX):
            found[jid] = Place(jid, "batch", jid[len(CHILD_PREFIX) :])
    wanted = set(jids) - set(found)
    if wanted:
        for running in Workers().all():
            if running.jid in wanted and running.jid not in found:
                found[running.jid] = Place(running.jid, "running", running.identity)
    sets = (
        ("retry", RetrySet()),
        ("scheduled", ScheduledSet()),
        ("dead", DeadSet()),
        ("unsettled", UnsettledSet()),
    )
    for kind, jobs in sets:
        if not wanted - set(found):
            break
        for record in jobs.filter(bid=bid):
            if record.jid in wanted and record.jid not in found:
                found[record.jid] = Place(record.jid, kind, record=record)
    if wanted - set(found):
        _in_queues(bid, wanted, found)
    return [found.get(jid) or Place(jid, "unknown") for jid in jids]


def _in_queues(bid: str, wanted: set[str], found: dict[str, Place]) -> None:
    """Adds to ``found`` the members of ``wanted`` met in the queues, reading
    each from its end (the next to run) for ``QUEUE_SCAN_ENTRIES`` entries."""
    client = get_redis()
    marker = b'"bid"'
    for queue in Queue.all():
        home = get_keys().for_queue(queue.name)
        for end in range(-1, -QUEUE_SCAN_ENTRIES - 1, -_QUEUE_CHUNK):
            if not wanted - set(found):
                return
            read = functools.partial(client.lrange, queue.key, end - _QUEUE_CHUNK + 1, end)
            raws = unless_wrong_type(read, None)
            if raws is None:  # a queue of the wrong type: Queue.all() notes it
                break
            for raw in reversed(raws):
                if marker not in raw:
                    continue
                jid = field_text(raw, "jid")
                if jid is None or (jid in wanted and jid not in found):
                    record = JobRecord(raw, source=queue.key, kind="queue", home=home)
                    if record.jid in wanted and record.jid not in found and record.bid == bid:
                        found[record.jid] = Place(record.jid, "queue", queue.name, record)
            if len(raws) < _QUEUE_CHUNK:
                break
