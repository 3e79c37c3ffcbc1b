"""The poller: moves due jobs from ``N:schedule`` and ``N:retry`` to their queues.

Each batch is read with one ``ZRANGEBYSCORE`` and moved with one
``move_due.lua`` call, which moves a job only if it is still in the set, so
many processes polling at once never move a job twice. The period is random
around ``POLL_INTERVAL`` times the number of live processes, so the whole
cluster polls every ``POLL_INTERVAL`` on average. A job whose deadline
(``expires``) has passed on Redis's clock is removed in the same call
instead of pushed, and recorded by ``expiry.drop`` (a batch's member counts
as succeeded). Each pass also sweeps the limiters (``limits.state.sweep``)
and forgets batches older than ``BATCH_TTL`` from ``N:batches``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from django_cogworker import expiry
from django_cogworker.conf import DEFAULT_QUEUE, get_config
from django_cogworker.errors import BadPayload
from django_cogworker.keys import Keys
from django_cogworker.limits import state
from django_cogworker.payload import Payload, encode_stored, parse
from django_cogworker.process import ProcessContext
from django_cogworker.scripts import script
from django_cogworker.workflows import effects, forward
from django_cogworker.workflows import state as batches

logger = logging.getLogger("django_cogworker")

BATCH_SIZE = 100


class Poller:
    def __init__(self, process: ProcessContext) -> None:
        self.process = process
        self.client = process.client
        self.keys = process.keys
        self.config = process.config

    def enqueue_due(self) -> int:
        moved = 0
        for zset in (self.keys.schedule, self.keys.retry):
            moved += self.move_due(zset)
        return moved

    def move_due(self, zset: str) -> int:
        return move_due(self.client, self.keys, zset, self.process.done)

    @staticmethod
    def prepare(
        entry: bytes, now: float, redis_now: float | None = None
    ) -> tuple[str, bytes, Payload | None]:
        """Its queue and the payload to push, with ``enqueued_at`` renewed;
        third, the payload when its deadline passed by ``redis_now``
        (dropped, not pushed). An unreadable entry goes to ``default``
        unchanged; the processor files it in dead (G13)."""
        try:
            payload = parse(entry)
        except BadPayload:  # not JSON, or nested too deeply to read
            return DEFAULT_QUEUE, entry, None
        queue = payload.get("queue") if isinstance(payload, dict) else None
        if not isinstance(queue, str) or not queue:
            return DEFAULT_QUEUE, entry, None
        if expiry.FIELD in payload and redis_now is not None and expiry.expired(payload, redis_now):
            return queue, entry, payload
        payload["enqueued_at"] = now
        return queue, encode_stored(payload), None

    def interval_s(self) -> float:
        try:
            processes = max(1, int(self.client.scard(self.keys.processes)))
        except Exception:
            processes = 1
        return self.config.poll_interval_s * processes * (0.5 + random.random())

    def run(self) -> None:
        # A first, short random wait spreads processes started together.
        done, outage = self.process.done, self.process.outage
        if done.wait(random.random() * self.config.poll_interval_s):
            return
        failing = False
        while True:
            try:
                self.enqueue_due()
                if self.keys.sharded:
                    # Workflows across slots (SPEC 16): the group's outbox, {N}:forward.
                    forward.run_pass(self.client, self.keys, self.config, self.process.done)
                # Limiters' waiters whose wake was missed, and idle names
                # forgotten (SPEC section 14): one HGETALL when none is used.
                state.sweep(self.client, self.keys)
                batches.trim(self.client, self.keys, self.config)
            except Exception as exc:
                # An outage is the process's to log (once); any other error
                # once until the poller works again, not on every pass.
                if not outage.failed(exc) and not failing:
                    logger.error("poller: %s: %s; retrying every pass", type(exc).__name__, exc)
                    failing = True
            else:
                outage.succeeded()
                if failing:
                    logger.warning("poller: working again")
                failing = False
            if done.wait(self.interval_s()):
                return


def move_due(client: Any, keys: Keys, zset: str, stop: threading.Event | None = None) -> int:
    """Moves the due jobs of ``zset`` to their queues, a batch per
    ``move_due.lua`` call (which moves a job only if it is still in the set,
    so processes polling at once never move a job twice). The testing
    helpers move due jobs through here too. Expired jobs are removed
    instead, and recorded (``expiry.drop``); Redis's time is read from the
    process's clock offset (the heartbeat's in a worker)."""
    moved = 0
    while stop is None or not stop.is_set():
        now = time.time()
        entries = client.zrangebyscore(zset, "-inf", repr(now), start=0, num=BATCH_SIZE)
        if not entries:
            break
        script_keys = [zset, keys.moved_to]
        args: list[bytes | str] = []
        expiring: dict[int, Payload] = {}
        redis_now: float | None = None
        for i, entry in enumerate(entries, 1):
            if redis_now is None and expiry.FIELD.encode() in entry:
                redis_now = expiry.clock.now(client)  # no round trip in a worker: the beat's offset
            queue, payload, late = Poller.prepare(entry, now, redis_now)
            queue = keys.own(queue)  # under SHARDING, a queue of this group
            script_keys.append(keys.queue(queue))
            if late is not None:
                expiring[i] = late
                queue = ""  # move_due.lua: removed, not pushed
            args += [entry, payload, queue]
        count, dropped = script("move_due")(client, script_keys, args)
        if keys.sharded and int(count):
            # The shared registry of queues (the admin's list), in the {N} slot.
            client.sadd(keys.queues, *{a for a in args[2::3] if a})
        count = int(count) + len(dropped)
        gone = [expiring[int(i)] for i in dropped]
        expiry.drop(client, keys, gone, f"not moved from {zset}")
        effects.expired(client, keys, get_config(), gone)
        moved += count
        if count == 0 or len(entries) < BATCH_SIZE:
            break  # nothing movable left (a broken queue key keeps its jobs back)
    return moved
