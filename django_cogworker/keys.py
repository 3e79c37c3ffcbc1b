"""Every Redis key name, built from the namespace (SPEC section 4).

No other module formats a key. ``Keys`` is cheap to build and immutable, so
callers take one from :func:`keys` (cached per namespace).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.escaping import storable

#: The minute in a per-minute counter's name (UTC): ``2026-03-14T09:05``.
MINUTE_FORMAT = "%Y-%m-%dT%H:%M"

#: A batch's keys, in the order the scripts take them: its hash, then its parts.
BATCH_PARTS = ("", "members", "pending", "failed", "succeeded", "dead", "results", "order")


class Keys:
    """The key names of a namespace where every queue shares one layout:
    ``SHARDING`` off, the default (SPEC section 4)."""

    #: Whether each queue group has keys of its own (:class:`ShardedKeys`).
    sharded = False

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._shared(namespace)
        self._per_group(namespace)

    def _shared(self, n: str) -> None:
        """The keys every queue shares: under ``SHARDING`` they stay in the
        ``{N}`` slot, written once per beat or per rare event."""
        self.queues = f"{n}:queues"
        self.paused = f"{n}:paused"
        self.processes = f"{n}:processes"
        self.workers_prefix = f"{n}:workers:"
        self.signals_prefix = f"{n}:signals:"
        self.stat_processed = f"{n}:stat:processed"
        self.stat_failed = f"{n}:stat:failed"
        #: Expired jobs (``expires``): the total, and a hash of counts by job name.
        self.stat_expired = f"{n}:stat:expired"
        self.stat_expired_jobs = f"{n}:stat:expired:jobs"
        self.recovery_report = f"{n}:recovery"
        self.periodic_last = f"{n}:periodic:last"
        self.metrics_prefix = f"{n}:metrics:"
        self.metrics_totals = f"{n}:metrics:totals"
        self.deploy_marks = f"{n}:metrics:marks"
        #: Every limiter seen (SPEC section 14): name -> its spec, as JSON.
        self.limits = f"{n}:limits"
        self.limit_prefix = f"{n}:limit:"
        self.limit_held_prefix = f"{n}:limits:held:"
        #: Every batch (SPEC section 13): bid -> created_at, epoch seconds.
        self.batches = f"{n}:batches"
        #: The open ones among them (bid -> created_at): the metrics' gauge.
        self.batches_open = f"{n}:batches:open"
        #: Callbacks enqueued, by event: the metrics' counter.
        self.stat_batch_callbacks = f"{n}:stat:batch_callbacks"
        self.batch_prefix = f"{n}:batch:"
        # A process's record and the beats: under SHARDING the shared ones
        # are for display and cleanup, and each group keeps its own, which
        # its master judges a death by (G2 per shard).
        self.process_prefix = f"{n}:process:"
        self.last_beat = f"{n}:last_beat"
        self.beats = f"{n}:beats"
        self.inprogress_identities = f"{n}:inprogress_identities"

    def _per_group(self, g: str) -> None:
        """The keys of one queue group (``g`` is its tag under ``SHARDING``)."""
        #: What every key of the group starts with: the namespace without
        #: SHARDING (one group), ``{N:<group>}`` with it.
        self.tag = g
        self.queue_prefix = f"{g}:queue:"
        self.schedule = f"{g}:schedule"
        self.retry = f"{g}:retry"
        self.dead = f"{g}:dead"
        self.inprogress_prefix = f"{g}:inprogress:"
        self.orphanings_prefix = f"{g}:orphanings:"
        self.repeat_orphans = f"{g}:repeat_orphans"
        self.suspect_prefix = f"{g}:suspect:"
        self.unsettled = f"{g}:unsettled"
        self.unique_prefix = f"{g}:unique:"
        self.periodic_running_prefix = f"{g}:periodic:running:"
        self.periodic_slot_prefix = f"{g}:periodic:slot:"
        self.replicated = f"{g}:replicated"
        #: The Tasks backend's result records: in the job's group, so that
        #: a record and its push share one MULTI.
        self.results_prefix = f"{g}:result:"
        self.clearing_prefix = f"{g}:clearing:"
        self.limit_waiting_prefix = f"{g}:limit:"
        #: Under SHARDING: the group's waiting lists ("<limiter>\0<queue>"
        #: -> the limiter's spec), and the processes found dead whose slots
        #: are still to be freed (limits/sharded.py).
        self.limit_waiters = f"{g}:limit_waiters"
        self.limits_freeing = f"{g}:limits:freeing"
        self.process_prefix = f"{g}:process:"
        self.last_beat = f"{g}:last_beat"
        self.beats = f"{g}:beats"
        self.inprogress_identities = f"{g}:inprogress_identities"
        #: The group's queues that jobs were moved to (``move_due.lua``):
        #: the shared registry without SHARDING, the group's own with it.
        self.moved_to = f"{g}:queues"
        #: Digests of the list entries moved into the group from the
        #: one-slot layout (``migrate_layout``): a rerun moves none twice.
        self.migrated = f"{g}:migrated"

    @property
    def shared(self) -> Keys:
        """The keys every group shares (the process records, the beats
        shown in the admin): these same keys when unsharded."""
        return self

    def group(self, name: str) -> Keys:
        """The keys of queue group ``name``: these same keys when unsharded."""
        return self

    def group_of(self, queue: str) -> str:
        """The group of ``queue`` (its ``QUEUE_GROUPS`` entry, else itself):
        a pure function of settings, that every process computes alone."""
        return queue

    def for_queue(self, queue: str) -> Keys:
        """The keys of the group ``queue`` belongs to."""
        return self

    def for_payload(self, payload: Mapping[str, Any]) -> Keys:
        """The keys of the group of a payload's queue (the default queue's
        when it names none a worker could read, as the requeue does)."""
        return self

    def queue_of(self, key: str) -> str:
        """The queue a queue key names (a blocking pop's reply names its key)."""
        return key.removeprefix(self.queue_prefix)

    def own(self, queue: str) -> str:
        """Where a job of ``queue`` held in this group goes back to (a
        requeue, a due job): ``queue`` itself when it is in the group;
        under SHARDING, for one of another group (a payload pushed by hand,
        or ``QUEUE_GROUPS`` changed since), the group's first queue, as no
        one script reaches two slots."""
        return queue

    def metrics_minute(self, minute: str) -> str:
        """The per-job metrics of ``minute`` (``MINUTE_FORMAT``, UTC)."""
        return self.metrics_prefix + minute

    def limit(self, name: str, part: str) -> str:
        """A limiter's key: ``holders``, ``starts``, ``queues``,
        ``promoted`` or ``max`` (``docs/redis-layout.md``)."""
        return f"{self.limit_prefix}{name}:{part}"

    def limit_waiting(self, name: str, queue: str) -> str:
        """The jobs of ``queue`` waiting for a slot of limiter ``name``."""
        return f"{self.limit_waiting_prefix}{name}:waiting:{queue}"

    def limit_held(self, identity: str) -> str:
        """The slots a process holds: ``<limiter>\\0<jid>`` members (G23)."""
        return self.limit_held_prefix + identity

    def queue_clearing(self, name: str, token: str) -> str:
        """A queue set aside by ``Queue.clear()`` while its batch members
        are counted dead, then deleted."""
        return f"{self.clearing_prefix}{token}:{name}"

    def batch(self, bid: str, part: str = "") -> str:
        """A batch's hash (``part`` empty), or one of its parts: the sets
        ``members``, ``pending``, ``failed``, ``succeeded``, ``dead``, the
        hash ``results`` and the list ``order`` (docs/redis-layout.md)."""
        return f"{self.batch_prefix}{bid}:{part}" if part else f"{self.batch_prefix}{bid}"

    def batch_keys(self, bid: str) -> list[str]:
        """Every key of a batch, in the order ``lua/lib/batches.lua`` takes
        them (``BATCH_PARTS``)."""
        return [self.batch(bid, part) for part in BATCH_PARTS]

    def queue(self, name: str) -> str:
        return self.queue_prefix + name

    def inprogress(self, identity: str) -> str:
        return self.inprogress_prefix + identity

    def process(self, identity: str) -> str:
        return self.process_prefix + identity

    def workers(self, identity: str) -> str:
        return self.workers_prefix + identity

    def signals(self, identity: str) -> str:
        return self.signals_prefix + identity

    def suspect(self, identity: str) -> str:
        return self.suspect_prefix + identity

    def orphanings(self, jid: str) -> str:
        # A jid read from a payload may hold a lone surrogate: the key names
        # it as the scripts' keys do (escaping.storable), whoever asks.
        return self.orphanings_prefix + storable(jid)

    def stat_processed_on(self, day: str) -> str:
        return f"{self.stat_processed}:{day}"

    def stat_failed_on(self, day: str) -> str:
        return f"{self.stat_failed}:{day}"

    def stat_processed_minute(self, minute: str) -> str:
        """The per-minute counter of ``minute`` (``MINUTE_FORMAT``, UTC)."""
        return f"{self.stat_processed}:minute:{minute}"

    def stat_failed_minute(self, minute: str) -> str:
        return f"{self.stat_failed}:minute:{minute}"

    def unique(self, digest: str) -> str:
        return self.unique_prefix + digest

    def periodic_running(self, pjid: str) -> str:
        return self.periodic_running_prefix + pjid

    def periodic_slot(self, pjid: str, slot: int) -> str:
        return f"{self.periodic_slot_prefix}{pjid}:{slot}"

    def result(self, jid: str) -> str:
        return self.results_prefix + jid


class GroupKeys(Keys):
    """The keys of one queue group under ``SHARDING = "queues"`` (SPEC
    section 16): its own under the tag ``{N:<group>}``, so that they share a
    slot, and the shared ones under ``{N}``. A queue named like its group is
    ``{N:<q>}:queue``; another queue of the group ``{N:<group>}:queue:<q>``."""

    sharded = True

    def __init__(self, namespace: str, group: str, root: ShardedKeys) -> None:
        self.namespace = namespace
        self.group_name = group
        self._root = root
        self._shared("{" + namespace + "}")
        self._per_group("{" + f"{namespace}:{group}" + "}")
        self._own_queue = self.queue_prefix.removesuffix(":")

    def queue(self, name: str) -> str:
        if name == self.group_name:
            return self._own_queue
        if self._root.group_of(name) == self.group_name:
            return self.queue_prefix + name
        return self._root.queue(name)  # a queue of another group: under its tag

    def queue_of(self, key: str) -> str:
        return self.group_name if key == self._own_queue else key.removeprefix(self.queue_prefix)

    def own(self, queue: str) -> str:
        if self._root.group_of(queue) == self.group_name:
            return queue
        return self._root.first_queue(self.group_name)

    @property
    def shared(self) -> Keys:
        return self._root

    def group(self, name: str) -> Keys:
        return self._root.group(name)

    def for_queue(self, queue: str) -> Keys:
        return self._root.for_queue(queue)

    def group_of(self, queue: str) -> str:
        return self._root.group_of(queue)

    def for_payload(self, payload: Mapping[str, Any]) -> Keys:
        return self._root.for_payload(payload)

    def limit_waiting(self, name: str, queue: str) -> str:
        if self._root.group_of(queue) == self.group_name:
            return super().limit_waiting(name, queue)
        return self._root.limit_waiting(name, queue)

    def queue_clearing(self, name: str, token: str) -> str:
        if self._root.group_of(name) == self.group_name:
            return super().queue_clearing(name, token)
        return self._root.queue_clearing(name, token)


class ShardedKeys(Keys):
    """The shared keys under ``SHARDING = "queues"``, and the way to each
    group's (:meth:`group`, :meth:`for_queue`). A key that belongs to a
    group is not here: asking for it is a mistake, and says so."""

    sharded = True

    def __init__(self, namespace: str, groups: dict[str, str]) -> None:
        self.namespace = namespace
        self._groups = groups
        self._group_keys: dict[str, GroupKeys] = {}
        self._shared("{" + namespace + "}")

    def __getattr__(self, name: str) -> str:
        # Only called for a name __init__ did not set: a group's key.
        raise AttributeError(
            f"{name} belongs to one queue group under SHARDING = 'queues': "
            "take it from keys.group() or keys.for_queue()"
        )

    def group(self, name: str) -> Keys:
        found = self._group_keys.get(name)
        if found is None:
            found = self._group_keys[name] = GroupKeys(self.namespace, name, self)
        return found

    def for_queue(self, queue: str) -> Keys:
        return self.group(self._groups.get(queue, queue))

    def for_payload(self, payload: Mapping[str, Any]) -> Keys:
        queue = payload.get("queue")
        return self.for_queue(queue if isinstance(queue, str) and queue else DEFAULT_QUEUE)

    def group_of(self, queue: str) -> str:
        return self._groups.get(queue, queue)

    def first_queue(self, group: str) -> str:
        """The first queue ``QUEUE_GROUPS`` lists in ``group``; the group
        itself when no entry names it (a group of one queue)."""
        return next((q for q, g in self._groups.items() if g == group), group)

    def queue(self, name: str) -> str:
        return self.for_queue(name).queue(name)

    def queue_of(self, key: str) -> str:
        raise AttributeError("a queue key belongs to one group: ask keys.group() which queue it names")

    def limit_waiting(self, name: str, queue: str) -> str:
        return self.for_queue(queue).limit_waiting(name, queue)

    def queue_clearing(self, name: str, token: str) -> str:
        return self.for_queue(name).queue_clearing(name, token)


@functools.lru_cache(maxsize=64)
def keys(namespace: str, groups: tuple[tuple[str, str], ...] | None = None) -> Keys:
    """The keys of ``namespace``; with ``groups`` (queue -> group pairs,
    from ``QUEUE_GROUPS``, empty when none), the sharded layout."""
    return Keys(namespace) if groups is None else ShardedKeys(namespace, dict(groups))
