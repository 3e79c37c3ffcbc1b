"""The dashboard's last hour: processed and failed per minute.

A worker's counts ride on its heartbeat, so they land in the per-minute
counters ``N:stat:processed:minute:<YYYY-MM-DDTHH:MM>`` (and ``failed``) of
the beat's minute, written by the same script call as the totals, with a
TTL of ``MINUTE_STATS_TTL_S``. ``api.Stats.per_minute()`` reads the last 60
in one MGET and the dashboard draws them as an inline SVG. Real Redis, real
workers, Django's test client."""

from __future__ import annotations

import datetime as dt
import re
import time
from html import unescape

from django_cogworker import api, stats
from django_cogworker.admin import chart
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.keys import MINUTE_FORMAT
from testproject.testapp import jobs
from tests.conftest import wait_for

DASHBOARD = "/admin/django_cogworker/job/dashboard/"

#: One column of the last hour's chart: its tooltip.
COLUMN = re.compile(r'<rect class="minute"[^>]*><title>([^<]*)</title></rect>')
TITLE = re.compile(r"(\d\d:\d\d) UTC: ([\d,]+) processed, ([\d,]+) failed")


def minute_name(at: dt.datetime) -> str:
    return at.strftime(MINUTE_FORMAT)


def last_hour(superclient) -> tuple[str, dict[str, tuple[int, int]]]:
    """The dashboard's last-hour SVG and its columns: minute -> (processed, failed)."""
    response = superclient.get(DASHBOARD)
    assert response.status_code == 200
    body = response.content.decode()
    section = body.split('id="cog-last-hour"', 1)[1].split('id="cog-history"', 1)[0]
    svg = section.split("<svg", 1)[1].split("</svg>", 1)[0]
    columns = {}
    for title in COLUMN.findall(svg):
        found = TITLE.fullmatch(unescape(title))
        assert found, title
        columns[found[1]] = (int(found[2].replace(",", "")), int(found[3].replace(",", "")))
    assert len(COLUMN.findall(svg)) == 60 == len(columns)
    return svg, columns


def minute_counters(cog, kind: str) -> dict[str, int]:
    return {
        key.decode(): int(cog.redis.get(key))
        for key in cog.redis.scan_iter(match=cog.key(f"stat:{kind}:minute:*"), count=1000)
    }


def test_a_worker_s_jobs_are_counted_per_minute_with_a_ttl_and_drawn(cog, superclient):
    n, f = 15, 3
    jobs.record.delay_many([((i,), {}) for i in range(n - f)])
    for i in range(f):
        jobs.fail_no_retry.delay(f"boom {i}")
    cog.start_worker()
    wait_for(lambda: api.Stats().processed == n, 20, f"{n} jobs to be counted")
    assert api.Stats().failed == f

    processed, failed = minute_counters(cog, "processed"), minute_counters(cog, "failed")
    assert sum(processed.values()) == n and sum(failed.values()) == f
    for key in [*processed, *failed]:
        assert stats.MINUTE_STATS_TTL_S - 60 < cog.redis.ttl(key) <= stats.MINUTE_STATS_TTL_S, key
        # Named after a minute of the last few (the beats' minutes, UTC).
        minute = dt.datetime.strptime(key.rsplit(":minute:", 1)[1], MINUTE_FORMAT).replace(tzinfo=dt.UTC)
        assert dt.timedelta(0) <= dt.datetime.now(dt.UTC) - minute < dt.timedelta(minutes=5), key

    hour = api.Stats.per_minute()
    assert len(hour) == 60 and sum(p for _, p, _ in hour) == n and sum(x for _, _, x in hour) == f

    svg, columns = last_hour(superclient)
    assert sum(p for p, _ in columns.values()) == n and sum(x for _, x in columns.values()) == f
    assert f"UTC: {n} processed, {f} failed" in unescape(svg.split('aria-label="', 1)[1].split('"', 1)[0])
    assert "http" not in svg.replace("http://www.w3.org", "")  # nothing fetched from elsewhere


def test_per_minute_is_the_last_hour_oldest_first_with_gaps_and_malformed_values_as_zero(cog):
    now = dt.datetime(2026, 3, 14, 9, 5, 42, tzinfo=dt.UTC)
    k = get_keys()
    values = {
        k.stat_processed_minute("2026-03-14T09:05"): 4,
        k.stat_failed_minute("2026-03-14T09:05"): 1,
        k.stat_processed_minute("2026-03-14T08:06"): 2,  # the oldest minute shown
        k.stat_processed_minute("2026-03-14T08:05"): 9,  # an hour ago: not shown
        k.stat_processed_minute("2026-03-14T08:30"): "not a number",
        k.stat_failed_minute("2026-03-14T08:30"): "-3",
        k.stat_processed_minute("2026-03-14T08:31"): "1.5",
    }
    for key, value in values.items():
        cog.redis.set(key, value)
    cog.redis.rpush(k.stat_processed_minute("2026-03-14T08:32"), "a list")

    hour = api.Stats.per_minute(now=now)
    assert [m for m, _, _ in hour] == [
        dt.datetime(2026, 3, 14, 8, 6, tzinfo=dt.UTC) + dt.timedelta(minutes=i) for i in range(60)
    ]
    counts = {m.strftime("%H:%M"): (p, f) for m, p, f in hour}
    assert counts["08:06"] == (2, 0) and counts["09:05"] == (4, 1)
    assert counts["08:30"] == counts["08:31"] == counts["08:32"] == (0, 0)
    assert sum(p for _, p, _ in hour) == 6 and sum(f for _, _, f in hour) == 1
    assert api.Stats.per_minute(0) == []


def test_count_outside_a_beat_writes_the_minute_too(cog):
    before = minute_name(dt.datetime.now(dt.UTC))
    stats.count(get_redis(), get_keys(), processed=2, failed=1)
    after = minute_name(dt.datetime.now(dt.UTC))
    processed, failed = minute_counters(cog, "processed"), minute_counters(cog, "failed")
    assert list(processed.values()) == [2] and list(failed.values()) == [1]
    for key in [*processed, *failed]:
        assert before <= key.rsplit(":minute:", 1)[1] <= after, key
        assert stats.MINUTE_STATS_TTL_S - 60 < cog.redis.ttl(key) <= stats.MINUTE_STATS_TTL_S


def test_the_dashboard_draws_a_malformed_minute_as_zero(cog, superclient):
    k = get_keys()
    now = dt.datetime.now(dt.UTC)
    # Minutes well inside the window, should the minute turn before the page is read.
    bad, good = now - dt.timedelta(minutes=2), now - dt.timedelta(minutes=3)
    cog.redis.set(k.stat_processed_minute(minute_name(bad)), "not a number")
    cog.redis.set(k.stat_failed_minute(minute_name(bad)), 5)
    cog.redis.set(k.stat_processed_minute(minute_name(good)), 7)
    cog.redis.hset(k.stat_failed_minute(minute_name(good)), "a", "hash")

    _, columns = last_hour(superclient)
    assert columns[f"{bad:%H:%M}"] == (0, 5)
    assert columns[f"{good:%H:%M}"] == (7, 0)
    assert sum(p for p, _ in columns.values()) == 7 and sum(f for _, f in columns.values()) == 5


def test_a_malformed_minute_counter_neither_stops_the_beat_nor_counts_twice(cog):
    k = get_keys()
    now = time.time()
    # Every minute the worker may beat in during this test.
    spoiled = [minute_name(dt.datetime.fromtimestamp(now + 60 * i, dt.UTC)) for i in range(-1, 6)]
    for minute in spoiled:
        cog.redis.set(k.stat_processed_minute(minute), "spoiled")
    jobs.record.delay_many([((i,), {}) for i in range(5)])
    worker = cog.start_worker()
    wait_for(lambda: api.Stats().processed == 5, 20, "5 jobs to be counted")
    identity = worker.identity()

    def beat_of() -> float:
        return float(cog.redis.hget(k.last_beat, identity) or 0)

    # Several more beats: a failed beat gives its counts back, and the next
    # one would add them to the totals again.
    for _ in range(3):
        before = beat_of()
        wait_for(lambda before=before: beat_of() > before, 10, "another beat")
    assert api.Stats().processed == 5
    assert cog.redis.get(k.stat_processed_on(stats.today())) == b"5"
    assert {cog.redis.get(k.stat_processed_minute(m)) for m in spoiled} == {b"spoiled"}
    assert "heartbeat failed" not in worker.log()


def test_minute_chart_has_a_column_per_minute_and_a_label_every_ten():
    start = dt.datetime(2026, 3, 14, 8, 6, tzinfo=dt.UTC)
    minutes = [(start + dt.timedelta(minutes=i), i % 7, i % 2) for i in range(60)]
    drawn = chart.minute_chart(minutes)
    columns = [b for b in drawn.bars if b.css_class == "minute"]
    assert len(columns) == 60 and columns[0].title == "08:06 UTC: 0 processed, 0 failed"
    assert columns[-1].title == "09:05 UTC: 3 processed, 1 failed"
    assert [t.text for t in drawn.ticks] == ["08:10", "08:20", "08:30", "08:40", "08:50", "09:00"]
    tallest = max((b for b in drawn.bars if b.css_class == "processed"), key=lambda b: b.height)
    assert tallest.title.endswith("6 processed, 0 failed")
    assert drawn.summary == "Jobs per minute from 08:06 to 09:05 UTC: 174 processed, 30 failed"
    assert chart.minute_chart([]).bars == []
