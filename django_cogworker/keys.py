"""Every Redis key name, built from the namespace (SPEC section 4).

No other module formats a key. ``Keys`` is cheap to build and immutable, so
callers take one from :func:`keys` (cached per namespace).
"""

from __future__ import annotations

import functools

from django_cogworker.escaping import storable

#: The minute in a per-minute counter's name (UTC): ``2026-03-14T09:05``.
MINUTE_FORMAT = "%Y-%m-%dT%H:%M"

#: A batch's keys, in the order the scripts take them: its hash, then its parts.
BATCH_PARTS = ("", "members", "pending", "failed", "succeeded", "dead", "results", "order")


class Keys:
    def __init__(self, namespace: str) -> None:
        n = namespace
        self.namespace = n
        self.queues = f"{n}:queues"
        self.queue_prefix = f"{n}:queue:"
        self.paused = f"{n}:paused"
        self.schedule = f"{n}:schedule"
        self.retry = f"{n}:retry"
        self.dead = f"{n}:dead"
        self.inprogress_prefix = f"{n}:inprogress:"
        self.inprogress_identities = f"{n}:inprogress_identities"
        self.process_prefix = f"{n}:process:"
        self.processes = f"{n}:processes"
        self.last_beat = f"{n}:last_beat"
        self.beats = f"{n}:beats"
        self.workers_prefix = f"{n}:workers:"
        self.signals_prefix = f"{n}:signals:"
        self.orphanings_prefix = f"{n}:orphanings:"
        self.repeat_orphans = f"{n}:repeat_orphans"
        self.suspect_prefix = f"{n}:suspect:"
        self.unsettled = f"{n}:unsettled"
        self.stat_processed = f"{n}:stat:processed"
        self.stat_failed = f"{n}:stat:failed"
        #: Expired jobs (``expires``): the total, and a hash of counts by job name.
        self.stat_expired = f"{n}:stat:expired"
        self.stat_expired_jobs = f"{n}:stat:expired:jobs"
        self.recovery_report = f"{n}:recovery"
        self.unique_prefix = f"{n}:unique:"
        self.periodic_running_prefix = f"{n}:periodic:running:"
        self.periodic_slot_prefix = f"{n}:periodic:slot:"
        self.periodic_last = f"{n}:periodic:last"
        self.results_prefix = f"{n}:result:"
        self.replicated = f"{n}:replicated"
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

    def metrics_minute(self, minute: str) -> str:
        """The per-job metrics of ``minute`` (``MINUTE_FORMAT``, UTC)."""
        return self.metrics_prefix + minute

    def limit(self, name: str, part: str) -> str:
        """A limiter's key: ``holders``, ``starts``, ``queues``,
        ``promoted`` or ``max`` (``docs/redis-layout.md``)."""
        return f"{self.limit_prefix}{name}:{part}"

    def limit_waiting(self, name: str, queue: str) -> str:
        """The jobs of ``queue`` waiting for a slot of limiter ``name``."""
        return f"{self.limit_prefix}{name}:waiting:{queue}"

    def limit_held(self, identity: str) -> str:
        """The slots a process holds: ``<limiter>\\0<jid>`` members (G23)."""
        return self.limit_held_prefix + identity

    def queue_clearing(self, name: str, token: str) -> str:
        """A queue set aside by ``Queue.clear()`` while its batch members
        are counted dead, then deleted."""
        return f"{self.namespace}:clearing:{token}:{name}"

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


@functools.lru_cache(maxsize=64)
def keys(namespace: str) -> Keys:
    return Keys(namespace)
