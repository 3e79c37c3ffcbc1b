"""What Redis holds cannot break the figures (SPEC sections 8 and 12),
through Django's test client and ``cogworker_status`` as a real process,
against a real Redis: malformed numbers (a field ``job|h²``, a 5000-digit
bucket index, a 400-digit value, a huge counter) are skipped and counted;
a deploy mark's label is text, whatever it holds; percentiles stay within
the runs observed; the Metrics and Queues pages are paginated."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from html import unescape
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import path

from django_cogworker import api, metrics, views
from django_cogworker.api import metrics as api_metrics
from django_cogworker.layouts import keys
from testproject.testapp import jobs
from tests.conftest import ROOT, manage_env, wait_for
from tests.test_metrics_page import BASE, job_url, minute_key, put, row_names, text
from tests.test_worker_logs import MANAGE, status

urlpatterns = [path("cogworker/metrics", views.metrics), path("admin/", admin.site.urls)]
pytestmark = pytest.mark.urls(__name__)

HUGE = "9" * 400  # int() reads it; no float holds it
LONGER_THAN_INT_READS = "7" * 5000  # int() refuses it (sys.get_int_max_str_digits)

#: Pages that read the totals (every jobs page's header) or the queues.
PAGES = ["dashboard/", "busy/", "queues/", "queues/default/", "metrics/", "metrics/app.ok/"]


def malformed_figures(cog: Any, at_s: float) -> None:
    """One good run of ``app.ok``, and six malformed fields, in the minute
    of ``at_s`` and in the totals."""
    put(cog, at_s, ("app.ok", 0.1, False))
    bad = {
        "app.bad|h²": 1,  # str.isdigit() says yes, int() says no
        f"app.bad|h{LONGER_THAN_INT_READS}": 1,
        "app.bad|h01": 1,  # not as a worker writes it
        "app.bad|us": HUGE,
        "app.bad|r": LONGER_THAN_INT_READS,
        "app.bad|f": "-3",
    }
    for key in (minute_key(cog, at_s), cog.key("metrics:totals")):
        cog.redis.hset(key, mapping=bad)


def huge_counters(cog: Any, queue: str = "default") -> None:
    cog.redis.set(cog.key("stat:failed"), HUGE)
    cog.redis.set(cog.key("stat:processed"), LONGER_THAN_INT_READS)
    # A queued job whose enqueued_at is a 400-digit integer: JSON reads it, no float holds it.
    raw = json.dumps({**jobs.record.payload((), {}), "enqueued_at": 0})
    raw = raw.replace('"enqueued_at": 0', f'"enqueued_at": {HUGE}')
    cog.redis.rpush(keys(cog.namespace).queue(queue), raw)
    cog.redis.sadd(cog.key("queues"), queue)


def test_g13_malformed_numbers_in_the_metrics_are_skipped_and_counted(cog, superclient):
    malformed_figures(cog, time.time())
    response = superclient.get(BASE + "metrics/")
    assert response.status_code == 200
    assert response.context["malformed_notes"][0].startswith("6 fields of the metrics hashes skipped")
    assert row_names(text(response)) == ["app.ok"]
    job = superclient.get(job_url("app.bad"))
    assert job.status_code == 200 and job.context["figures"].runs == 0
    samples = views_scrape(superclient)
    assert 'cogworker_job_runs_total{job="app.ok",outcome="success"} 1' in samples
    assert "app.bad" not in samples


def views_scrape(client: Client) -> str:
    response = client.get("/cogworker/metrics")
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def huge_process(cog: Any) -> None:
    """A live process's record with figures no float or 64-bit integer holds."""
    key = cog.key("process:h:1:x")
    fields = {"identity": "h:1:x", "busy": HUGE, "concurrency": LONGER_THAN_INT_READS, "started_at": HUGE}
    cog.redis.hset(key, mapping={**fields, "rss_kb": HUGE, "beat": HUGE})
    cog.redis.expire(key, 60)
    cog.redis.sadd(cog.key("processes"), "h:1:x")


def test_g13_huge_counters_and_times_are_read_as_0_on_every_page(cog, superclient):
    huge_counters(cog)
    huge_process(cog)
    malformed_figures(cog, time.time())
    for page in PAGES:
        response = superclient.get(BASE + page)
        assert response.status_code == 200, page
    body = unescape(text(superclient.get(BASE + "dashboard/")))
    assert "stat:failed" in body and "is not a whole number" in body
    samples = views_scrape(superclient)
    assert "\ncogworker_failed_total 0\n" in samples and "\ncogworker_processed_total 0\n" in samples
    assert 'cogworker_queue_latency_seconds{queue="default"} 0' in samples
    assert "\ncogworker_processes 1\n" in samples and "\ncogworker_busy_threads 0\n" in samples


def test_g13_cogworker_status_reads_huge_numbers_without_a_traceback(cog):
    # On a queue the worker does not serve: the worker counts nothing, so
    # its beat never adds to the huge counters.
    huge_counters(cog, queue="later")
    code, out, err = status(cog)
    assert (code, err) == (1, ""), err
    worker = cog.start_worker()
    worker.identity()
    huge_process(cog)
    code, out, err = status(cog, "--json")
    assert (code, err) == (0, ""), err
    assert len(json.loads(out)["processes"]) == 2
    code, out, err = status(cog)
    assert (code, err) == (0, ""), err
    assert "processes: 2 live" in out and "later: 1 waiting, latency 0.0s" in out


# -- deploy marks ------------------------------------------------------------------------------


def test_a_mark_with_a_lone_surrogate_is_stored_as_text_and_every_page_renders(cog, superclient):
    put(cog, time.time(), ("app.ok", 0.1, False))
    mark = api.mark_deploy("v\ud800")
    assert mark.label == "v\\ud800"
    env = manage_env(cog)
    # The argument a shell passes for "$(printf 'release-\xff')": not UTF-8.
    done = subprocess.run(
        [sys.executable.encode(), str(MANAGE).encode(), b"cogworker_mark_deploy", b"release-\xff"],
        env=env,
        capture_output=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    # A label stored by an older version, escaped in its JSON.
    cog.redis.zadd(cog.key("metrics:marks"), {'{"label": "old \\udcff", "at": 1}': time.time() - 60})
    for page in ("metrics/", "metrics/app.ok/"):
        response = superclient.get(BASE + page)
        assert response.status_code == 200, page
        body = unescape(text(response))
        for label in ("v\\ud800", "release-\\udcff", "old \\udcff"):
            assert f"Deploy {label} (" in body
    assert sorted(m.label for m in api.deploy_marks(0, time.time() + 60)) == [
        "old \\udcff",
        "release-\\udcff",
        "v\\ud800",
    ]


# -- percentiles within the runs observed ------------------------------------------------------


def percentiles(figures: metrics.JobFigures) -> list[float]:
    return [figures.percentile(q) for q in (0.5, 0.95, 0.99)]


def test_percentiles_are_clamped_to_the_fastest_and_slowest_run(cog, superclient):
    now = time.time()
    # Two runs of exactly 6.0 s, in two minutes: interpolated in the bucket
    # 5 s to 10 s, p50 would be 7.5 s and p99 9.95 s.
    put(cog, now - 60, ("app.six", 6.0, False))
    put(cog, now, ("app.six", 6.0, False), ("app.mixed", 6.0, False))
    # Minutes written by an older version: no fastest and slowest run kept.
    old = {"|r": 2, "|us": 12_000_000, "|h12": 2}
    for name in ("app.old", "app.mixed"):
        cog.redis.hset(minute_key(cog, now - 120), mapping={name + k: v for k, v in old.items()})
    response = superclient.get(BASE + "metrics/")
    shown = {row.figures.name: row.figures.percentiles for row in response.context["rows"]}
    assert shown["app.six"] == [("p50", "6 s"), ("p95", "6 s"), ("p99", "6 s")]
    assert superclient.get(job_url("app.six")).context["figures"].percentiles == shown["app.six"]
    # Not every run's extremes known: estimated in the bucket, as before.
    assert shown["app.old"] == [("p50", "7.5 s"), ("p95", "9.75 s"), ("p99", "9.95 s")]
    assert shown["app.mixed"][0] == ("p50", "7.5 s")
    assert response.context["malformed_notes"] == []


def test_a_workers_beat_writes_the_fastest_and_slowest_run_of_each_minute(cog):
    worker = cog.start_worker()
    for i in range(2):
        jobs.sleep_then_record.delay(0.3, i)

    def both_runs() -> dict[str, Any] | None:
        found = {}
        for key in cog.redis.scan_iter(match=cog.key("metrics:2*")):
            found.update({k.decode(): int(v) for k, v in cog.redis.hgetall(key).items() if b"sleep" in k})
        runs = sum(v for k, v in found.items() if k.endswith("|r"))
        return found if runs == 2 else None

    # Written by the beat: the worker still runs.
    fields = wait_for(both_runs, 30, "both runs in the minutes' figures")
    assert worker.alive()
    name = jobs.sleep_then_record.name
    lo_us, hi_us = fields[f"{name}|lo"], fields[f"{name}|hi"]
    assert 300_000 <= lo_us <= hi_us
    figures = api_metrics.summed(api_metrics.minutes(1))[name]
    assert (figures.lo_us, figures.hi_us) == (lo_us, hi_us)
    assert all(lo_us / 1e6 <= p <= hi_us / 1e6 for p in percentiles(figures)), percentiles(figures)
    # The totals (Prometheus' histogram) have no use for them.
    assert not [f for f in cog.redis.hkeys(cog.key("metrics:totals")) if f.endswith((b"|lo", b"|hi"))]
