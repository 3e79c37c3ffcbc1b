"""One action on many stored jobs: the admin's bulk actions, a batch's
retry of its dead members, a queue's clearing.

Duties: ``bulk()`` applies one of ``ACTIONS`` (``JobRecord.apply``) to
every record, ``BULK_BATCH_SIZE`` moves per pipeline round trip. On a Redis
Cluster the records of a chunk are grouped by the master that holds their
key's slot, and each group is pipelined on a plain connection to that
master: redis-py's cluster pipeline does not send ``EVALSHA``. Under
``SHARDING`` that makes a pipeline per queue group's master. A move that
would span two slots (``JobRecord.crosses``), and the chunk of a master
that answers a redirection (a slot moving to another master), go one call
per entry, which redis-py routes. Every move checks its source first, so
replaying one moves nothing twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from django_cogworker.api.records import ACTIONS, JobRecord
from django_cogworker.connection import get_keys, get_redis, is_cluster
from django_cogworker.errors import redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.scripts import script
from django_cogworker.workflows import effects

#: Entries moved per pipeline round trip by ``bulk()``.
BULK_BATCH_SIZE = 500


@redis_boundary("act on the jobs")
def bulk(records: Iterable[JobRecord], action: str) -> int:
    """Applies one of ``ACTIONS`` to every record; returns how many entries
    were moved or deleted. Entries that someone else moved first are
    skipped (each move checks its source)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
    client, keys = get_redis(), get_keys()
    cluster = is_cluster(client)
    loaded: set[str] = set()
    done = 0
    iterator = iter(records)
    while chunk := list(itertools.islice(iterator, BULK_BATCH_SIZE)):
        alone: list[JobRecord] = []
        parts: dict[str, tuple[Any, list[JobRecord]]] = {}
        for record in chunk:
            if record.crosses(action):
                alone.append(record)
                continue
            node = client.get_node_from_key(storable(record.source)) if cluster else None
            name = node.name if node is not None else ""
            conn = node.redis_connection if node is not None else client
            parts.setdefault(name, (conn, []))[1].append(record)
        for name, (conn, part) in parts.items():
            if name not in loaded:
                script("move").ensure_loaded(conn)
                loaded.add(name)
            try:
                done += _pipelined(conn, part, action)
            except ResponseError as exc:
                if not str(exc).startswith(("MOVED", "ASK")):
                    raise
                alone += part  # its slot is moving: each entry routed on its own
        done += sum(1 for r in alone if r.apply(action))
        if keys.sharded and action == "retry":
            # The shared registry of queues, in the {N} slot (JobRecord.retry does the same).
            client.sadd(keys.queues, *{r.destination_queue for r in chunk})
        for record in {r.home: r for r in chunk if effects.levels(r.payload)}.values():
            record.forward_ends()  # once per group: members' moves to their batches
    return done


def _pipelined(client: Any, chunk: list[JobRecord], action: str) -> int:
    """``action`` on every record of ``chunk``, in one pipeline on ``client``."""
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        queued = [r._queue_action(pipe, action) for r in chunk]
        if not any(queued):
            return 0
        try:
            return sum(1 for reply in pipe.execute() if reply)
        except NoScriptError:
            # The server lost its scripts between the load and this batch
            # (restart, failover). Replaying is safe: moves already done
            # find their entry gone and return 0.
            if attempt == 2:
                raise
            script("move").ensure_loaded(client)
    return 0
