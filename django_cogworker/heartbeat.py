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
Signals sent through Redis (quiet, stop) are collected on the way.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from django_cogworker.connection import follow_master
from django_cogworker.metrics import METRICS_TTL_S
from django_cogworker.scripts import script
from django_cogworker.stats import DAILY_STATS_TTL_S, MINUTE_STATS_TTL_S, minute, stat_keys
from django_cogworker.summaries import summary

if TYPE_CHECKING:
    from django_cogworker.launcher import Launcher

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


class Heartbeat:
    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.manager = launcher.manager
        self.started_at = time.time()
        self.hostname = socket.gethostname()
        self.unregistered = False  # the registration failed on the last beat (logged once)
        # The summary of each job running now, made once per job rather than
        # once per beat (a payload may be megabytes to parse): keyed by the
        # id of its payload bytes, which the entry keeps alive and checks.
        self.summaries: dict[int, tuple[bytes, dict[str, Any]]] = {}

    def fields(self) -> dict[str, str]:
        m = self.manager
        return {
            "identity": m.identity,
            "hostname": self.hostname,
            "pid": str(os.getpid()),
            "tag": self.launcher.tag,
            "concurrency": str(m.concurrency),
            "queues": json.dumps([q.name if not q.weight else f"{q.name},{q.weight}" for q in m.queues]),
            "busy": str(m.busy()),
            "quiet": "1" if m.quiet.is_set() else "0",
            "started_at": repr(self.started_at),
            "rss_kb": str(rss_kb()),
            "fetch": m.fetch_mode,
            "recovery": json.dumps(self.launcher.recovery.last_report),
            "processor_crashes": str(m.crashes),
        }

    def beat(self) -> list[str]:
        m = self.manager
        k = m.keys
        processed, failed, tally = m.ledger.take_counts()
        fields = self.fields()
        jobs = self.running_records()
        increments = tally.increments()
        now = time.time()  # one clock reading: the day's, the minute's counters and metrics agree
        args: list[str | bytes | int] = [
            m.identity,
            max(1, round(m.config.heartbeat_ttl_s)),
            processed,
            failed,
            "1" if m.reliable else "0",
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
        try:
            registered, signals, full = script("heartbeat")(
                m.client,
                [
                    k.process(m.identity),
                    k.processes,
                    k.last_beat,
                    k.inprogress_identities,
                    k.workers(m.identity),
                    k.signals(m.identity),
                    *stat_keys(k, now),
                    k.beats,
                    k.metrics_minute(minute(now)),
                    k.metrics_totals,
                ],
                args,
            )
        except Exception:
            m.ledger.give_counts_back(processed, failed, tally)
            raise
        if full:
            # The minimal beat wrote no counters: they wait for one that can.
            m.ledger.give_counts_back(processed, failed, tally)
            m.outage.filled()
        else:
            m.outage.has_room()
        if not registered and not self.unregistered:
            logger.error(
                "could not register in %s (a key of the wrong type?): if this process dies, only a "
                "process starting up (its key scan) will find the jobs it held",
                k.inprogress_identities,
            )
        self.unregistered = not registered
        return [s.decode() for s in signals]

    def running_records(self) -> list[str | bytes]:
        """jid, record pairs of the jobs running now for ``N:workers``: a
        bounded summary of each (``summaries.summary``), never the payload
        itself, which a beat would otherwise send again and again."""
        summaries: dict[int, tuple[bytes, dict[str, Any]]] = {}
        jobs: list[str | bytes] = []
        for thread, running in self.manager.ledger.running_now():
            work, started = running.work, running.started_at
            cached = self.summaries.get(id(work.raw))
            about = cached[1] if cached is not None and cached[0] is work.raw else summary(work.raw)
            summaries[id(work.raw)] = (work.raw, about)
            record = {**about, "queue": work.queue, "run_at": started, "thread": thread}
            jobs += [about["jid"] or f"unreadable-{thread}", json.dumps(record)]
        self.summaries = summaries  # only the jobs running now
        return jobs

    def run(self) -> None:
        interval = self.manager.config.heartbeat_interval_s
        outage = self.manager.outage
        failing = False
        while not self.launcher.done.wait(interval):
            try:
                follow_master(self.manager.client)
                signals = self.beat()
            except Exception as exc:
                if not outage.failed(exc) and not failing:
                    logger.error("heartbeat failed (%s: %s); retrying every beat", type(exc).__name__, exc)
                    failing = True
                continue
            outage.succeeded()
            if failing:
                logger.warning("heartbeat restored")
                failing = False
            for signal in signals:
                self.launcher.remote_signal(signal)
