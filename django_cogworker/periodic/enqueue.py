"""Enqueueing one slot of a periodic entry, exactly once across all processes.

Duties:
- the payload of a slot: the entry's job with its arguments and queue,
  marked with the pjid and the slot (and ``until_executed``), through the
  client middleware chain like any enqueue;
- the push, in one ``periodic_enqueue.lua`` call with the per-slot marker
  ``N:periodic:slot:<pjid>:<slot>``, set NX: whichever process comes first
  pushes, every other one finds the marker. For an ``until_executed`` entry
  the same call skips the slot while the previous run holds the running lock
  (:mod:`django_cogworker.periodic.lock`), or takes the lock for the new run;
- with ``ENQUEUE_WAIT_REPLICAS``, the wait for replicas after a push
  (:mod:`django_cogworker.confirm`);
- a payload that is not pushed after all (the slot was taken, skipped, or
  the call failed) is cancelled through the client chain, so a unique lock
  taken for it is given back.
"""

from __future__ import annotations

import logging

import redis

from django_cogworker import confirm, middleware, registry
from django_cogworker.conf import get_config
from django_cogworker.errors import JobNotRegistered
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode
from django_cogworker.periodic.entry import Entry, entry_queue
from django_cogworker.periodic.lock import PERIODIC_QUEUED_TTL_S
from django_cogworker.scripts import script

logger = logging.getLogger("django_cogworker")

#: How long a slot's marker lives: past the ticker's grace window
#: (``ticker.LATE_GRACE_S``) plus any clock skew between hosts we tolerate,
#: so a host whose clock lags cannot enqueue a slot again after its marker
#: expired.
SLOT_MARKER_TTL_S = 600

# What enqueue_slot did.
PUSHED = "pushed"
ALREADY = "already"  # another process (or this one) enqueued or skipped the slot
SKIPPED = "skipped"  # until_executed: the previous run still holds the lock
REFUSED = "refused"  # a client middleware refused the payload


def slot_payload(entry: Entry, slot: float, now: float) -> Payload:
    job = registry.get(entry.job)
    if job is None:
        raise JobNotRegistered(
            f"periodic entry for {entry.job!r}: no @job with that name is registered in this process"
        )
    if entry.queue:
        job = job.set(queue=entry.queue)
    payload = job.payload(entry.args, dict(entry.kwargs), now)
    payload["periodic_pjid"] = entry.pjid
    payload["periodic_slot"] = int(slot)
    if entry.until_executed:
        payload["periodic_until_executed"] = True
    return payload


def _shared_records(client: redis.Redis, keys: Keys, queue: str, pjid: str, now: float) -> None:
    """Under SHARDING, what the script writes in the shared slot without it:
    the queue registry and the entry's last run. Their loss only hides a
    queue or a last run from the admin for a while: logged, not raised."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.sadd(keys.queues, queue)
        pipe.hset(keys.periodic_last, pjid, repr(now))
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("periodic %s: pushed, but its last run was not recorded (%s)", pjid, exc)


def enqueue_slot(client: redis.Redis, keys: Keys, entry: Entry, slot: float, now: float) -> str:
    """Enqueues one slot unless any process did it first. Returns PUSHED,
    ALREADY, SKIPPED or REFUSED."""
    keys = keys.for_queue(entry_queue(entry))  # the marker and the lock beside the queue
    marker = keys.periodic_slot(entry.pjid, int(slot))
    # Cheap first look, so that the client chain (a unique lock, a user's
    # middleware) runs about once per slot, not once per process.
    if client.exists(marker):
        return ALREADY
    chain = middleware.client_chain()
    payload = chain.run(slot_payload(entry, slot, now))
    if payload is None:
        return REFUSED
    queue = str(payload["queue"])
    try:
        script_keys = [marker, keys.periodic_running(entry.pjid), keys.queue(queue)]
        if not keys.sharded:
            script_keys += [keys.queues, keys.periodic_last]
        reply = script("periodic_enqueue")(
            client,
            script_keys,
            [
                encode(payload),
                queue,
                SLOT_MARKER_TTL_S,
                "1" if entry.until_executed else "0",
                str(payload["jid"]),
                PERIODIC_QUEUED_TTL_S,
                entry.pjid,
                repr(now),
            ],
        )
    except BaseException:
        chain.cancel(payload)
        raise
    if int(reply) == 1:
        logger.debug("periodic %s (%s): enqueued jid=%s", entry.job, entry.cron, payload["jid"])
        if keys.sharded:
            _shared_records(client, keys, queue, entry.pjid, now)
        config = get_config()
        if confirm.wanted(config):
            # The slot's marker is set: this slot is not pushed again, by
            # this process or another. Raised to the ticker, which logs it.
            confirm.confirm(client, [keys], config, [str(payload["jid"])])
        return PUSHED
    chain.cancel(payload)
    if int(reply) == -1:
        logger.debug(
            "periodic %s (%s): slot skipped, the previous run is still queued or running",
            entry.job,
            entry.cron,
        )
        return SKIPPED
    return ALREADY
