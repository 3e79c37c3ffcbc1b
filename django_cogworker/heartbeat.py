"""The heartbeat: the process record, the presence key and the counters.

Duties: beat once before the first fetch (so a live process's list is never
taken for an orphan's) and then every ``HEARTBEAT_INTERVAL``: the presence
key ``N:process:<identity>`` with TTL ``HEARTBEAT_TTL``, the ``N:last_beat``
stamp on Redis's clock, the registration in ``N:inprogress_identities``, the
processed/failed counters accumulated since the last beat, and the record of
the jobs running now (``N:workers:<identity>``: a short summary of each,
made once per job), all in one script. So the admin is truthful to within
one beat, and a job costs Redis nothing for them. On a full Redis
(``maxmemory`` reached) the beat is the minimal one, which Redis still
takes: the presence, the stamps, the registration and the signals; the
counters and metrics wait in the ledger for a beat with room (SPEC section 8).
Signals sent through Redis (quiet, stop) are collected on the way and
handed to ``on_signal``; the beat's ``TIME`` keeps the process's offset
from Redis's clock (``expiry.clock``) fresh. On stop,
:meth:`Heartbeat.deregister` undoes the beat: the last counters are written
and the process's records removed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from django_cogworker import expiry, metrics, stats
from django_cogworker.connection import follow_master
from django_cogworker.ledger import Ledger
from django_cogworker.metrics import METRICS_TTL_S
from django_cogworker.process import ProcessContext
from django_cogworker.scripts import script
from django_cogworker.stats import DAILY_STATS_TTL_S, MINUTE_STATS_TTL_S, minute, stat_keys
from django_cogworker.summaries import summary

logger = logging.getLogger("django_cogworker")


def rss_kb() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


class Status(NamedTuple):
    """What the work of the process says on a beat."""

    #: The fields of the process record that change (busy, quiet, fetch, ...).
    fields: dict[str, str]
    #: Whether this process keeps an in-progress list, which the beat registers.
    reliable: bool


class Heartbeat:
    def __init__(
        self,
        process: ProcessContext,
        ledger: Ledger,
        status: Callable[[], Status],
        on_signal: Callable[[str], None],
    ) -> None:
        """``ledger``: the counters a beat sends and the jobs running now;
        ``status()``: read on every beat; ``on_signal``: a signal sent
        through Redis ("quiet", "stop", "dump")."""
        self.process = process
        self.ledger = ledger
        self.status = status
        self.on_signal = on_signal
        self.started_at = time.time()
        self.hostname = socket.gethostname()
        self.unregistered = False  # the registration failed on the last beat (logged once)
        # The summary of each job running now, made once per job rather than
        # once per beat (a payload may be megabytes to parse): keyed by the
        # id of its payload bytes, which the entry keeps alive and checks.
        self.summaries: dict[int, tuple[bytes, dict[str, Any]]] = {}

    def fields(self, status: Status) -> dict[str, str]:
        return {
            "identity": self.process.identity,
            "hostname": self.hostname,
            "pid": str(os.getpid()),
            "tag": self.process.tag,
            "started_at": repr(self.started_at),
            "rss_kb": str(rss_kb()),
            **status.fields,
        }

    def beat(self, *, group: bool = True) -> list[str]:
        """One beat; under SHARDING the group's too unless ``group=False``
        (the group beat's own thread sends it: :meth:`run_group`)."""
        p = self.process
        k = p.keys
        status = self.status()
        if k.sharded and group:
            # The group's liveness first, on its own master (before the
            # counts are taken: a failure here must not lose them); the
            # shared records (the admin's, never a death decision) then.
            self.beat_group(status.reliable)
        processed, failed, tally = self.ledger.take_counts()
        fields = self.fields(status)
        jobs = self.running_records()
        increments = tally.increments()
        now = time.time()  # one clock reading: the day's, the minute's counters and metrics agree
        args: list[str | bytes | int] = [
            p.identity,
            max(1, round(p.config.heartbeat_ttl_s)),
            processed,
            failed,
            "1" if status.reliable else "0",
            DAILY_STATS_TTL_S,
            MINUTE_STATS_TTL_S,
            len(fields),
            len(increments) // 2,
            METRICS_TTL_S,
        ]
        for name, value in fields.items():
            args += [name, value]
        args += increments
        args += jobs
        if k.sharded:
            args[4] = "0"  # the registration is the group beat's
        sent_at, sent_mono = time.time(), time.monotonic()
        s = k.shared
        try:
            registered, signals, full, redis_now = script("heartbeat")(
                p.client,
                [
                    s.process(p.identity),
                    s.processes,
                    s.last_beat,
                    s.inprogress_identities,
                    s.workers(p.identity),
                    s.signals(p.identity),
                    *stat_keys(s, now),
                    s.beats,
                    s.metrics_minute(minute(now)),
                    s.metrics_totals,
                ],
                args,
            )
        except Exception:
            self.ledger.give_counts_back(processed, failed, tally)
            raise
        if not k.sharded:
            expiry.clock.observe(float(redis_now), sent_at, time.time())
            p.registration.renewed(sent_mono)
            self.check_registered(registered)
        if full:
            # The minimal beat wrote no counters: they wait for one that can.
            self.ledger.give_counts_back(processed, failed, tally)
            p.outage.filled()
        else:
            p.outage.has_room()
        return [sent.decode() for sent in signals]

    def check_registered(self, registered: int) -> None:
        if not registered and not self.unregistered:
            logger.error(
                "could not register in %s (a key of the wrong type?): if this process dies, only a "
                "process starting up (its key scan) will find the jobs it held",
                self.process.keys.inprogress_identities,
            )
        self.unregistered = not registered

    def beat_group(self, reliable: bool) -> None:
        """Under SHARDING: the beat to the process's queue group, whose
        master decides alone whether the process died (``group_beat.lua``);
        it renews the registration the fetch waits for (G18) and reads that
        master's clock (``expiry.clock``)."""
        p = self.process
        k = p.keys
        ttl = max(1, round(p.config.heartbeat_ttl_s))
        sent_at, sent_mono = time.time(), time.monotonic()
        registered, now = script("group_beat")(
            p.client,
            [k.process(p.identity), k.last_beat, k.beats, k.inprogress_identities, k.inprogress(p.identity)],
            [p.identity, ttl, "1" if reliable else "0"],
        )
        expiry.clock.observe(float(now), sent_at, time.time())
        p.registration.renewed(sent_mono)
        self.check_registered(int(registered))

    def running_records(self) -> list[str | bytes]:
        """jid, record pairs of the jobs running now for ``N:workers``: a
        bounded summary of each (``summaries.summary``), never the payload
        itself, which a beat would otherwise send again and again."""
        summaries: dict[int, tuple[bytes, dict[str, Any]]] = {}
        jobs: list[str | bytes] = []
        for thread, running in self.ledger.running_now():
            work, started = running.work, running.started_at
            cached = self.summaries.get(id(work.raw))
            about = cached[1] if cached is not None and cached[0] is work.raw else summary(work.raw)
            summaries[id(work.raw)] = (work.raw, about)
            record = {**about, "queue": work.queue, "run_at": started, "thread": thread}
            jobs += [about["jid"] or f"unreadable-{thread}", json.dumps(record)]
        self.summaries = summaries  # only the jobs running now
        return jobs

    def run(self) -> None:
        # Under SHARDING the group's beats have a thread of their own
        # (run_group): a stall of the shared slot's master must not hold up
        # the liveness of the group, nor the fetch that waits for it.
        # Looked up on each beat (the tests replace Heartbeat.beat).
        sharded = self.process.keys.sharded
        beat = (lambda: self.beat(group=False)) if sharded else (lambda: self.beat())
        for signals in self._every_beat("heartbeat", beat):
            for signal in signals:
                self.on_signal(signal)

    def run_group(self) -> None:
        """Under SHARDING, the beats to the process's group."""
        for _ in self._every_beat("group beat", lambda: self.beat_group(self.status().reliable)):
            pass

    def _every_beat(self, what: str, beat: Callable[[], Any]) -> Iterator[Any]:
        """``beat()``'s results, one per HEARTBEAT_INTERVAL until the stop; a
        failure logged once until one succeeds again."""
        p = self.process
        failing = False
        while not p.done.wait(p.config.heartbeat_interval_s):
            try:
                follow_master(p.client)
                result = beat()
            except Exception as exc:
                if not p.outage.failed(exc) and not failing:
                    logger.error("%s failed (%s: %s); retrying every beat", what, type(exc).__name__, exc)
                    failing = True
                continue
            p.outage.succeeded()
            if failing:
                logger.warning("%s restored", what)
                failing = False
            yield result

    def deregister(self) -> None:
        """Undoes the beat on stop: the counters and metrics since the last
        beat written, the process's records removed; its registration kept
        while anything is left on its in-progress list. Best effort."""
        p = self.process
        k = p.keys
        try:
            processed, failed, tally = self.ledger.take_counts()
            stats.count(p.client, k, processed=processed, failed=failed)
            pipe = p.client.pipeline(transaction=False)
            metrics.write(pipe, k, tally)  # what ran since the last beat
            for key in (
                k.process(p.identity),
                *([k.shared.process(p.identity)] if k.sharded else []),
                k.workers(p.identity),
                k.signals(p.identity),
                k.suspect(p.identity),
            ):
                pipe.delete(key)  # one key per DEL: a cluster pipeline takes no other
            pipe.srem(k.processes, p.identity)
            pipe.execute()
            # Keep the registration while anything is left on the list (a
            # job that could not even be handed over): recovery finds it.
            if p.client.llen(k.inprogress(p.identity)) == 0:
                pipe = p.client.pipeline(transaction=False)
                for each in {k, k.shared}:
                    pipe.srem(each.inprogress_identities, p.identity)
                    pipe.hdel(each.last_beat, p.identity)
                pipe.execute()
        except Exception as exc:
            logger.error("could not deregister %s: %s", p.identity, exc)
