"""``manage.py cogworker_status [--json]``: what is running, for people,
probes and scripts.

Prints the live processes, the queues with their size and latency, and
the scheduled/retry/dead/unsettled sizes, and a warning when Redis keeps
nothing on disk (``persistence_warning``; null when it does, or when it
would not say). ``--shards`` adds where the queues' keys live
(``shards.spread``): each group, its slot and master, and the masters
that hold none. Exit status: 0 when at least
one live process is registered, 1 when none is, 2 when Redis cannot be
read (unreachable, or it refused: a wrong password, say). A liveness probe
runs it as it is; a script reads ``--json``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_cogworker import api, shards
from django_cogworker.conf import get_config
from django_cogworker.connection import describe, get_keys, get_redis
from django_cogworker.errors import CogworkerError, full_message
from django_cogworker.escaping import one_line

#: Exit statuses.
LIVE, NO_PROCESS, NO_REDIS = 0, 1, 2


def snapshot(*, with_shards: bool = False) -> dict[str, Any]:
    """Everything the command reports, read from Redis in a fixed number of
    round trips (CogworkerError when Redis cannot be read)."""
    now = time.time()
    processes = [
        {
            "identity": p.identity,
            "hostname": p.hostname,
            "pid": p.pid,
            "tag": p.tag,
            "concurrency": p.concurrency,
            "async_concurrency": p.async_concurrency,
            "busy": p.busy,
            "queues": p.queues,
            "quiet": p.quiet,
            "last_beat_s_ago": round(max(0.0, now - p.last_beat), 1) if p.last_beat else None,
        }
        for p in api.ProcessSet().all()
    ]
    queues = [
        {"name": q.name, "size": q.size, "latency_s": round(q.latency_s, 3), "paused": q.paused}
        for q in api.queue_figures(api.Queue.all())
    ]
    stats = api.Stats()
    sizes = {
        "scheduled": stats.scheduled_size,
        "retry": stats.retry_size,
        "dead": stats.dead_size,
        "unsettled": stats.unsettled_size,
    }
    found = api.memory()
    figures = {} if found is None else {"used_memory": found.used_bytes, "maxmemory": found.maxmemory_bytes}
    report: dict[str, Any] = {
        "processes": processes,
        "queues": queues,
        **sizes,
        **figures,
        "full": bool(found and found.full),
        "persistence_warning": api.persistence_note(),
    }
    if with_shards:
        names = [str(q["name"]) for q in queues]
        report["shards"] = shards.spread(get_redis(), get_keys(), names, get_config()).as_dict()
    return report


def as_text(report: dict[str, Any]) -> str:
    """The report for people, every line escaped (``escaping.one_line``):
    a queue name or a tag holding a newline, ANSI escapes or a bidi
    override can neither forge a line nor hide one."""
    lines = [f"Redis {report['redis']}"]
    if report["persistence_warning"]:
        lines.append(f"warning: {report['persistence_warning']}")
    if report["full"]:
        lines.append(full_message(report["used_memory"], report["maxmemory"]))
    processes = report["processes"]
    lines.append(f"processes: {len(processes)} live")
    for p in processes:
        beat = "" if p["last_beat_s_ago"] is None else f", last beat {p['last_beat_s_ago']:.0f}s ago"
        tag = f", tag {p['tag']}" if p["tag"] else ""
        quiet = ", quiet" if p["quiet"] else ""
        capacity = (
            f"{p['concurrency']} + {p['async_concurrency']} async"
            if p["async_concurrency"]
            else p["concurrency"]
        )
        lines.append(
            f"  {p['identity']}: pid {p['pid']}{tag}, busy {p['busy']}/{capacity}, "
            f"queues {','.join(p['queues']) or '-'}{beat}{quiet}"
        )
    lines.append(f"queues: {len(report['queues'])}")
    for q in report["queues"]:
        paused = ", paused" if q["paused"] else ""
        lines.append(f"  {q['name']}: {q['size']} waiting, latency {q['latency_s']:.1f}s{paused}")
    lines.append(
        f"scheduled {report['scheduled']}, retry {report['retry']}, dead {report['dead']}, "
        f"unsettled {report['unsettled']}"
    )
    if "shards" in report:
        lines.extend(shards.lines(report["shards"]))
    return "\n".join(one_line(line) for line in lines)


class Command(BaseCommand):
    help = (
        "Print cogworker's live processes, queues and set sizes. Exit status 0: at least one "
        "live process; 1: none; 2: Redis cannot be read."
    )
    requires_system_checks: list[str] = []  # a probe must not fail on an unrelated check

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--shards",
            action="store_true",
            help="also where the queues' keys live: each group's hash slot and master, "
            "and the masters that hold none",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        where = describe(get_config())  # never the password
        try:
            report = {"redis": where, **snapshot(with_shards=options["shards"])}
        except CogworkerError as exc:
            message = f"Redis at {where} cannot be read: {exc}"
            if options["json"]:
                self.stdout.write(json.dumps({"redis": where, "error": message}))
            self.stderr.write(one_line(f"cogworker_status: {message}"))
            sys.exit(NO_REDIS)
        self.stdout.write(json.dumps(report) if options["json"] else as_text(report))
        sys.exit(LIVE if report["processes"] else NO_PROCESS)
