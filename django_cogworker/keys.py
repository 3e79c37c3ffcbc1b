"""Every Redis key name, built from the namespace (SPEC section 4).

No other module formats a key (``layouts.py`` has the sharded layout's).
``Keys`` is immutable, so callers take one made once per namespace:
:func:`keys_of` (a ``.delay()`` asks for them), or ``layouts.keys()``
under ``SHARDING``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django_cogworker.escaping import storable

#: The minute in a per-minute counter's name (UTC): ``2026-03-14T09:05``.
MINUTE_FORMAT = "%Y-%m-%dT%H:%M"

#: A batch's keys, in the order the scripts take them: its hash, then its parts.
BATCH_PARTS = ("", "members", "pending", "failed", "succeeded", "dead", "results", "order")


class Keys:
    """The key names of a namespace where every queue shares one layout:
    ``SHARDING`` off, the default (SPEC section 4)."""

    #: Whether each queue group has keys of its own (``layouts.ShardedKeys``).
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
        #: Under SHARDING: the jobs a batch's script pushes (its members at
        #: its opening, its callbacks, a chain's next step), as a schedule
        #: (score: when due), which ``workflows/forward.py`` moves to their
        #: groups; without it a batch's script pushes them itself.
        self.forward = f"{n}:forward"
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
        #: Processes recovery forgot (identity -> when, Redis's clock), kept
        #: for ``recovery.FORGOTTEN_KEEP_S``: a list of theirs that fills
        #: again is registered again (``remember.lua``, G18).
        self.forgotten = f"{g}:forgotten"
        #: The group's queues that jobs were moved to (``move_due.lua``):
        #: the shared registry without SHARDING, the group's own with it.
        self.moved_to = f"{g}:queues"
        #: Under SHARDING: the ends of the group's batch members, for
        #: ``workflows/forward.py`` to apply to their batches in ``{N}``
        #: (a list, oldest first; each entry numbered from ``outbox_seq``;
        #: one that cannot be applied set aside in ``outbox_unapplied``),
        #: and the digests of the jobs forwarded into the group, by time,
        #: so that a forward repeated after a crash pushes nothing twice.
        self.outbox = f"{g}:outbox"
        self.outbox_seq = f"{g}:outbox:seq"
        self.outbox_unapplied = f"{g}:outbox:unapplied"
        self.forwarded = f"{g}:forwarded"
        #: Digests of the list entries moved into the group from the
        #: one-slot layout (``migrate_layout``): a rerun moves none twice.
        self.migrated = f"{g}:migrated"

    @property
    def shared(self) -> Keys:
        """The keys every group shares (the process records, the beats
        shown in the admin): these same keys when unsharded."""
        return self

    @property
    def batch_schedule(self) -> str:
        """Where a batch's script puts the jobs it starts (its members, its
        callbacks, a chain's next step): ``N:schedule``, which the poller
        moves to their queues; under SHARDING ``{N}:forward``, as no script
        on the batch's slot reaches the queues' slots."""
        return self.schedule

    def home(self, payload: Mapping[str, Any]) -> Keys:
        """The keys of the group a script about ``payload`` runs in: these
        keys when they are one group's (or unsharded), else its queue's."""
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


@functools.cache
def keys_of(namespace: str) -> Keys:
    """The keys of ``namespace`` without ``SHARDING``, made once."""
    return Keys(namespace)
