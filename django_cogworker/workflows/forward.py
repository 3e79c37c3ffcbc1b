"""Workflows under SHARDING (SPEC sections 13 and 16): a batch's state
lives in the ``{N}`` slot, its members in their groups' slots, and no
script reaches two slots. Two lists carry what crosses between them:

- each group's outbox (``{N:<group>}:outbox``): the ends of its members,
  numbered and queued in the same step as their ack or filing
  (``lua/lib/batches.lua``). :func:`apply_outbox` applies them to their
  batches in order (``batch_apply.lua``, which takes no end twice, nor an
  older one after a newer), then removes each.
- ``{N}:forward``: what a batch's script starts (its members, its
  callbacks, a chord's body, a chain's next step), with when it is due.
  :func:`push_forwarded` pushes each into its group (``forward_push.lua``,
  which pushes none twice), then removes it.

Either step may be cut by a crash between its two calls, or run by two
processes at once: the next pass repeats it, and the scripts make the
repeat change nothing. A worker's poller runs both for its group every
pass; a workflow job's end runs them at once in the thread that sent it,
and a batch's opening pushes its members at once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import redis

from django_cogworker.conf import DEFAULT_QUEUE, Config
from django_cogworker.errors import BadPayload, is_unavailable
from django_cogworker.keys import Keys
from django_cogworker.payload import encode, parse
from django_cogworker.scripts import Arg, script
from django_cogworker.workflows.effects import MARKER
from django_cogworker.workflows.state import level_keys, ttls

logger = logging.getLogger("django_cogworker")

#: Entries read per call.
BATCH = 100

#: How long a group keeps the digest of a job forwarded into it: a
#: forward repeated later than that (a process stopped for a day between
#: its push and the entry's removal) would push the job a second time.
FORWARDED_KEEP_S = 24 * 3600


def apply_outbox(client: Any, keys: Keys, config: Config, stop: threading.Event | None = None) -> int:
    """Applies the ends queued in the outbox of ``keys``'s group to their
    batches, oldest first; returns how many were taken off. One that
    cannot be applied (not an end, or a batch's key of the wrong type,
    written by hand) is set aside in ``{N:g}:outbox:unapplied``, with an
    error logged, so that it holds up no other."""
    shared, taken = keys.shared, 0
    while stop is None or not stop.is_set():
        entries = client.lrange(keys.outbox, 0, BATCH - 1)
        for entry in entries:
            call = apply_call(shared, config, entry)
            try:
                if call is None:
                    raise ValueError("not an end as effects.outbox_args writes one")
                script("batch_apply")(client, *call)
            except (ValueError, redis.ResponseError) as exc:
                if is_unavailable(exc):
                    raise
                logger.error(
                    "outbox %s: an end set aside, not applied (%s): %r", keys.outbox, exc, entry[:200]
                )
                pipe = client.pipeline(transaction=True)  # both in the group's slot
                pipe.rpush(keys.outbox_unapplied, entry)
                pipe.lrem(keys.outbox, 1, entry)
                pipe.execute()
            else:
                client.lrem(keys.outbox, 1, entry)
            taken += 1
        if len(entries) < BATCH:
            break
    return taken


def apply_call(shared: Keys, config: Config, entry: bytes) -> tuple[list[str], list[Arg]] | None:
    """``batch_apply.lua``'s KEYS and ARGV for one outbox entry
    (``<number>|<the end as JSON>``, ``effects.outbox_args``)."""
    seq, _, body = entry.partition(b"|")
    try:
        end = parse(body)
        group, move, member, bids, result = end["g"], end["m"], end["j"], end["b"], end["r"]
        following = end["n"]
        int(seq)
    except (BadPayload, KeyError, TypeError, ValueError):
        return None
    if not isinstance(bids, list) or not all(isinstance(b, str) for b in bids):
        return None
    nxt = following if isinstance(following, dict) else None
    script_keys = [
        shared.forward,
        shared.queues,
        shared.stat_batch_callbacks,
        shared.batches_open,
        shared.forward,  # the next step's "queue": forwarded too
        *level_keys(shared, bids),
    ]
    args: list[Arg] = [
        str(group),
        seq,
        MARKER,
        str(move),
        str(member),
        len(bids),
        *bids,
        *ttls(config),
        str(result or ""),
        encode(nxt) if nxt is not None else b"",
        str(nxt.get("jid") or "") if nxt is not None else "",
        str(nxt.get("queue") or DEFAULT_QUEUE) if nxt is not None else "",
    ]
    return script_keys, args


def push_forwarded(client: Any, keys: Keys, stop: threading.Event | None = None) -> int:
    """Pushes what waits in ``{N}:forward`` into each job's group: on its
    queue, or in its schedule when due later; returns how many entries
    were taken off."""
    shared, taken, kept = keys.shared, 0, 0
    while stop is None or not stop.is_set():
        entries = client.zrange(shared.forward, kept, kept + BATCH - 1, withscores=True)
        queues = set()
        for raw, due in entries:
            queue = _queue_of(raw)
            group = shared.for_queue(queue)
            digest = hashlib.sha1(raw).hexdigest()
            try:
                script("forward_push")(
                    client,
                    [group.queue(queue), group.moved_to, group.schedule, group.forwarded],
                    [raw, digest, queue, repr(due), FORWARDED_KEEP_S],
                )
            except redis.ResponseError as exc:
                if is_unavailable(exc) or "WRONGTYPE" not in str(exc):
                    raise
                # A queue key of the wrong type (G12): the job waits here,
                # and holds up no other; the admin's queue page names the key.
                kept += 1
                continue
            client.zrem(shared.forward, raw)
            queues.add(queue)
            taken += 1
        if queues:
            client.sadd(shared.queues, *queues)  # the shared registry: the admin's list
        if len(entries) < BATCH:
            break
    return taken


def _queue_of(raw: bytes) -> str:
    """The job's queue; the default queue for one that names none (its
    worker files an unreadable payload in dead, G13)."""
    try:
        payload = parse(raw)
    except BadPayload:
        return DEFAULT_QUEUE
    queue = payload.get("queue") if isinstance(payload, dict) else None
    return queue if isinstance(queue, str) and queue else DEFAULT_QUEUE


def run_pass(client: Any, keys: Keys, config: Config, stop: threading.Event | None = None) -> None:
    """Both steps: the outbox of ``keys``'s group (when they are one
    group's: a worker's), then ``{N}:forward``."""
    if getattr(keys, "group_name", None) is not None:
        apply_outbox(client, keys, config, stop)
    push_forwarded(client, keys, stop)


_lock = threading.Lock()
_wanted: dict[str, tuple[Any, Keys, Config]] = {}


def soon(client: Any, keys: Keys, config: Config) -> None:
    """Under SHARDING, :func:`run_pass` now, in this thread, unless another
    thread of the process is at it: that one then goes round once more.
    Called after every script that may write an outbox or ``{N}:forward``,
    so that a move reaches its batch at once rather than at the group's
    next poll; without SHARDING there is nothing to forward. A failure is
    left to the poller's next pass (nothing is lost: both lists keep their
    entries until they are applied)."""
    if not keys.sharded:
        return
    _wanted[getattr(keys, "group_name", "")] = (client, keys, config)
    while _wanted and _lock.acquire(blocking=False):
        try:
            while _wanted:
                _, (client, keys, config) = _wanted.popitem()
                run_pass(client, keys, config)
        except Exception as exc:
            _wanted.clear()
            logger.info("workflows: forwarding left to the poller (%s: %s)", type(exc).__name__, exc)
        finally:
            _lock.release()
