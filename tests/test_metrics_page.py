"""The admin's Metrics tab and per-job pages (SPEC section 12), through
Django's test client, against a real Redis: figures written by two real
worker processes add up exactly; the minutes expire; sorting and hours;
the per-job charts' bars; permissions as every jobs page; a job name is
escaped and encoded; deploy marks; malformed data is a note, Redis down a
503."""

from __future__ import annotations

import json
import re
import signal
import time
from html import unescape
from typing import Any

import pytest
from django.core.management import call_command

from django_cogworker import api, metrics
from django_cogworker.admin import metrics_chart
from django_cogworker.admin.helpers import segment
from django_cogworker.admin.metrics_chart import hhmm
from django_cogworker.connection import get_redis
from django_cogworker.layouts import keys
from testproject.testapp import jobs
from tests.conftest import wait_for
from tests.test_admin import client_for, make_user

BASE = "/admin/django_cogworker/job/"
XSS = "<script>alert('x')</script>\"/x"
ESCAPED_XSS = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;/x"


def text(response: Any) -> str:
    return response.content.decode()


def job_url(name: str, query: str = "") -> str:
    # reverse() encodes the segment once more: the test client decodes once.
    return f"{BASE}metrics/{segment(name).replace('%', '%25')}/{query}"


def put(cog: Any, at_s: float, *runs: tuple[str, float, bool]) -> None:
    """Figures of ``runs`` (name, seconds, failed) in the minute of
    ``at_s``, written as a worker writes them (``metrics.write``)."""
    tally = metrics.Tally()
    for name, took_s, failed in runs:
        tally.add(name, took_s, failed)
    pipe = get_redis().pipeline(transaction=False)
    metrics.write(pipe, keys(cog.namespace), tally, at_s)
    pipe.execute()


def minute_key(cog: Any, at_s: float) -> str:
    from django_cogworker.stats import minute

    return keys(cog.namespace).metrics_minute(minute(at_s))


def row_names(body: str) -> list[str]:
    return [unescape(n) for n in re.findall(r'<th scope="row"><a href="[^"]+">([^<]*)</a></th>', body)]


def titles(body: str) -> list[str]:
    return [unescape(t) for t in re.findall(r"<title>([^<]*)</title>", body)]


# -- figures from real workers ---------------------------------------------------------


def test_two_worker_processes_figures_add_up_exactly_and_their_minutes_expire(cog, superclient):
    # One process per queue: each surely runs its share of both job names.
    first = cog.start_worker(QUEUES=["default"])
    second = cog.start_worker(QUEUES=["mail"])
    first.identity(), second.identity()
    on_mail_record, on_mail_fail = jobs.record.set(queue="mail"), jobs.fail_no_retry.set(queue="mail")
    for i in range(12):
        jobs.record.delay(i)
        on_mail_record.delay(i)
    for i in range(4):
        jobs.fail_no_retry.delay(f"boom {i}")
    for i in range(3):
        on_mail_fail.delay(f"boom {i}")
    wait_for(lambda: len(cog.notes()) == 31, 30, "31 runs")
    assert {n["pid"] for n in cog.notes()} == {first.pid, second.pid}
    # A stopping process writes its last figures: then every figure is in.
    for worker in (first, second):
        worker.signal(signal.SIGTERM)
    assert [first.wait(20), second.wait(20)] == [0, 0]

    response = superclient.get(BASE + "metrics/")
    assert response.status_code == 200
    rows = {row.figures.name: row.figures for row in response.context["rows"]}
    assert set(rows) == {jobs.record.name, jobs.fail_no_retry.name}
    assert (rows[jobs.record.name].runs, rows[jobs.record.name].failures) == (24, 0)
    assert (rows[jobs.fail_no_retry.name].runs, rows[jobs.fail_no_retry.name].failures) == (7, 7)
    body = text(response)
    assert "31 runs, 7 failed, 2 job names in the last 1 h" in body
    assert "31 runs, 7 failed" in response.context["runs_chart"].summary
    assert response.context["malformed_notes"] == []

    job = superclient.get(job_url(jobs.fail_no_retry.name))
    assert job.context["figures"].runs == 7 and job.context["figures"].failures == 7
    per_minute = {t for t in titles(text(job)) if "runs, " in t}  # each thrice: column, runs, failures
    assert sum(int(t.split(": ")[1].split()[0]) for t in per_minute) == 7

    minutes = list(cog.redis.scan_iter(match=cog.key("metrics:2*")))
    assert minutes
    for key in minutes:
        assert 0 < cog.redis.ttl(key) <= 8 * 3600


# -- the table: sort and hours --------------------------------------------------------


@pytest.fixture
def three_jobs(cog) -> None:
    now = time.time()
    put(cog, now - 120, *[("app.a", 0.1, False)] * 10)  # total 1 s, mean 100 ms
    put(cog, now - 60, *[("app.b", 2.0, False)] * 2)  # total 4 s, mean 2 s
    put(cog, now, *[("app.c", 0.001, i < 5) for i in range(50)])  # total 50 ms, 5 failed


@pytest.mark.parametrize(
    ("query", "order"),
    [
        ("", ["app.b", "app.a", "app.c"]),
        ("?sort=total", ["app.b", "app.a", "app.c"]),
        ("?sort=runs", ["app.c", "app.a", "app.b"]),
        ("?sort=failures", ["app.c", "app.a", "app.b"]),  # ties by name
        ("?sort=mean", ["app.b", "app.a", "app.c"]),
        ("?sort=nonsense", ["app.b", "app.a", "app.c"]),
        ("?sort=%3Cscript%3E&hours=abc", ["app.b", "app.a", "app.c"]),
    ],
)
def test_jobs_are_sorted_by_total_time_by_default_or_by_a_valid_column(
    cog, superclient, three_jobs, query, order
):
    response = superclient.get(BASE + "metrics/" + query)
    assert response.status_code == 200
    assert row_names(text(response)) == order
    assert "<script>" not in text(response)


def test_each_row_shows_its_figures_and_histogram(cog, superclient, three_jobs):
    body = text(superclient.get(BASE + "metrics/"))
    row = body.split(">app.b</a>", 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="cog-num">([^<]*)</td>', row)
    # Runs, failures, total, mean, then p50/p95/p99: interpolated in the bucket
    # 1 s to 2.5 s (1.75, 2.42, 2.48 s), then kept within the runs, 2 s each.
    assert cells == ["2", "0", "4 s", "2 s", "2 s", "2 s", "2 s"]
    assert "≤ 2.5 s: 2 runs (100%)" in unescape(row) and "≤ 1 ms: 0 runs (0%)" in unescape(row)
    assert f'href="{job_url("app.b", "?hours=1")}"' in body
    assert 'aria-sort="descending"' in body.split("Total time")[0].rsplit("<th", 1)[1]


def test_hours_choose_how_far_back_the_figures_reach(cog, superclient):
    now = time.time()
    put(cog, now - 3 * 3600, ("app.old", 0.5, False))
    put(cog, now - 60, ("app.new", 0.5, False))
    assert row_names(text(superclient.get(BASE + "metrics/"))) == ["app.new"]
    assert row_names(text(superclient.get(BASE + "metrics/?hours=2"))) == ["app.new"]
    for hours in (4, 8):
        response = superclient.get(BASE + f"metrics/?hours={hours}")
        assert row_names(text(response)) == ["app.new", "app.old"]
        assert len(response.context["runs_chart"].bars) == 3 * 60 * hours  # column, runs, failures
    # Not one of metrics.HOURS: the last hour.
    for query in ("?hours=3", "?hours=-1", "?hours=99999999999999999999999", "?hours="):
        assert row_names(text(superclient.get(BASE + "metrics/" + query))) == ["app.new"]
    assert superclient.get(job_url("app.old", "?hours=8")).context["figures"].runs == 1
    assert superclient.get(job_url("app.old")).context["figures"].runs == 0


# -- one job's page --------------------------------------------------------------------


def test_job_page_draws_runs_failures_mean_and_histogram_per_minute(cog, superclient):
    now = time.time()
    put(cog, now - 300, *[("app.report", 0.2, i < 2) for i in range(7)])
    put(cog, now - 1200, *[("app.report", 0.004, False)] * 3)
    put(cog, now - 1200, ("app.other", 9.0, True))
    response = superclient.get(job_url("app.report"))
    assert response.status_code == 200
    shown = titles(text(response))
    assert f"{hhmm(now - 300)} UTC: 7 runs, 2 failed" in shown
    assert f"{hhmm(now - 1200)} UTC: 3 runs, 0 failed" in shown
    assert f"{hhmm(now - 300)} UTC: mean 200 ms over 7 runs" in shown
    assert f"{hhmm(now - 1200)} UTC: mean 4 ms over 3 runs" in shown
    # The column (its tooltip), the runs bar, the failures bar.
    assert shown.count(f"{hhmm(now - 300)} UTC: 7 runs, 2 failed") == 3  # column, runs, failures
    assert sum(1 for t in shown if t.endswith("UTC: no runs")) == 2 * 58
    assert "≤ 250 ms: 7 runs (70%)" in shown and "≤ 5 ms: 3 runs (30%)" in shown
    assert "> 300 s: 0 runs (0%)" in shown
    f = response.context["figures"]
    assert (f.runs, f.failures, f.total, f.mean) == (10, 2, "1.41 s", "141 ms")
    # p95 and p99 interpolate to 239 and 248 ms: no run took more than 200 ms.
    assert f.percentiles == [("p50", "143 ms"), ("p95", "200 ms"), ("p99", "200 ms")]
    assert "app.other" not in text(response)
    assert response.context["runs_chart"].summary.endswith("10 runs, 2 failed")


def test_a_job_name_with_markup_and_quotes_is_escaped_and_encoded(cog, superclient):
    put(cog, time.time(), (XSS, 0.01, True))
    api.mark_deploy("<b>v2</b>")
    pages = [superclient.get(BASE + "metrics/"), superclient.get(job_url(XSS))]
    for response in pages:
        assert response.status_code == 200
        body = text(response)
        assert "<script>alert" not in body and "<b>v2" not in body
        assert ESCAPED_XSS in body and "&lt;b&gt;v2&lt;/b&gt;" in body
    assert f'href="{job_url(XSS, "?hours=1")}"' in text(pages[0])
    assert pages[1].context["figures"].runs == 1


# -- deploy marks ------------------------------------------------------------------------


def test_deploy_marks_are_drawn_on_the_charts_in_range(cog, superclient):
    now = time.time()
    put(cog, now - 600, ("app.report", 0.2, False))
    api.mark_deploy("v1.4.2", at=now - 900)
    api.mark_deploy("v1.4.1", at=now - 3 * 3600)
    one_hour = [superclient.get(job_url("app.report")), superclient.get(BASE + "metrics/")]
    for response in one_hour:
        body = text(response)
        assert body.count('<g class="mark">') == (2 if "mean_chart" in response.context else 1)
        assert any(t.startswith("Deploy v1.4.2 (") and t.endswith(" UTC)") for t in titles(body))
        assert "v1.4.1" not in body
    x = one_hour[0].context["runs_chart"].marks[0].x
    chart = one_hour[0].context["runs_chart"]
    # 15 minutes back of a 60-minute chart, whatever the second.
    assert (
        chart.left + 44 * (chart.right - chart.left) / 60
        <= x
        <= chart.left + 46 * (chart.right - chart.left) / 60
    )
    four_hours = text(superclient.get(BASE + "metrics/?hours=4"))
    assert "Deploy v1.4.1 (" in four_hours and "Deploy v1.4.2 (" in four_hours


def test_mark_deploy_caps_the_label_and_trims_old_marks(cog):
    now = time.time()
    key = cog.key("metrics:marks")
    cog.redis.zadd(key, {json.dumps({"label": "ancient", "at": now - 9 * 3600}): now - 9 * 3600})
    mark = api.mark_deploy("x" * 500)
    assert mark.label == "x" * 200 and abs(mark.at - now) < 5
    members = cog.redis.zrange(key, 0, -1, withscores=True)
    assert [(json.loads(m)["label"], s) for m, s in members] == [("x" * 200, mark.at)]
    assert json.loads(members[0][0])["at"] == mark.at
    api.mark_deploy("same", at=now - 60)
    api.mark_deploy("same", at=now - 30)
    assert [m.label for m in api.deploy_marks(now - 120, now + 10)] == ["same", "same", "x" * 200]
    with pytest.raises(TypeError, match="label must be a string"):
        api.mark_deploy(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch seconds"):
        api.mark_deploy("v", at=float("nan"))


def test_the_mark_deploy_command_stores_a_mark(cog, capsys):
    call_command("cogworker_mark_deploy", "release 7", "--at", str(time.time() - 5))
    assert "Marked 'release 7'" in capsys.readouterr().out
    assert [m.label for m in api.deploy_marks(time.time() - 60, time.time())] == ["release 7"]


# -- malformed data, permissions, Redis down --------------------------------------------


def test_malformed_fields_and_marks_are_a_note_never_a_500(cog, superclient):
    now = time.time()
    put(cog, now - 60, ("app.ok", 0.1, False))
    cog.redis.hset(minute_key(cog, now - 60), mapping={"abc": 1, "app.ok|zz": 1, "app.bad|r": "many"})
    cog.redis.rpush(minute_key(cog, now - 120), "a list, not a hash")
    cog.redis.zadd(cog.key("metrics:marks"), {"not json": now - 60, '{"label": 7}': now - 50})
    for url in (BASE + "metrics/", job_url("app.ok"), job_url("app.bad")):
        response = superclient.get(url)
        assert response.status_code == 200
        notes = response.context["malformed_notes"]
        assert notes[0] == "3 fields of the metrics hashes skipped (not <job>|<kind>, or not a whole number)"
        assert len(notes) == 3 and all("is not a deploy mark: skipped" in n for n in notes[1:])
        assert "Malformed in Redis: 3 fields of the metrics hashes skipped" in unescape(text(response))
    rows = superclient.get(BASE + "metrics/").context["rows"]
    assert [(r.figures.name, r.figures.runs) for r in rows] == [("app.ok", 1)]
    cog.redis.delete(cog.key("metrics:marks"))
    cog.redis.set(cog.key("metrics:marks"), "a string")
    response = superclient.get(BASE + "metrics/")
    assert response.status_code == 200
    assert response.context["malformed_notes"][1].endswith("is not a sorted set: no deploy marks shown")


PAGES = ["metrics/", "metrics/?hours=8&sort=runs", "metrics/app.report/"]


@pytest.fixture
def users(db) -> dict[str, Any]:
    return {
        "super": make_user("boss", perms=("view_job", "change_job")),
        "viewer": make_user("viewer", perms=("view_job",)),
        "staff": make_user("staffer"),
        "plain": make_user("plain", staff=False, perms=("view_job", "change_job")),
    }


@pytest.mark.parametrize("page", PAGES)
def test_metrics_pages_take_the_same_permissions_as_every_jobs_page(cog, users, page):
    put(cog, time.time(), ("app.report", 0.1, False))
    for name in ("super", "viewer"):
        response = client_for(users[name]).get(BASE + page)
        assert response.status_code == 200
        body = text(response)
        assert 'aria-label="Jobs"' in body and 'aria-current="page">Metrics' in body
    for user in (None, users["plain"]):
        response = client_for(user).get(BASE + page)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert client_for(users["staff"]).get(BASE + page).status_code == 403


def test_every_jobs_page_has_the_metrics_tab(cog, superclient):
    body = text(superclient.get(BASE + "dashboard/"))
    assert f'<a href="{BASE}metrics/">Metrics</a>' in body


@pytest.mark.parametrize("page", PAGES)
def test_metrics_pages_answer_503_when_redis_is_down(cog, own_redis, superclient, page):
    server = own_redis()
    server.stop()
    response = superclient.get(BASE + page)
    assert response.status_code == 503
    assert "Redis is unreachable" in text(response)


# -- the charts' geometry ------------------------------------------------------------------


def test_minute_labels_and_chart_tops():
    assert [metrics_chart.minute_label_every(60 * h) for h in metrics.HOURS] == [10, 15, 30, 60]
    tops = [metrics_chart.nice_top(v) for v in (0, 0.0042, 0.2, 3, 7.5, 10, 250)]
    assert tops == pytest.approx([1, 0.008, 0.2, 4, 8, 10, 400])
    spark = metrics_chart.spark([0] * 16 + [4], "x")
    assert len(spark.bars) == 34 and spark.bars[-1].height == spark.height - 2
    assert spark.bars[-1].title == "> 300 s: 4 runs (100%)"


def test_no_chart_needs_a_network_or_a_script(cog, superclient, three_jobs):
    for url in (BASE + "metrics/", job_url("app.a")):
        body = text(superclient.get(url))
        for svg in re.findall(r"<svg.*?</svg>", body, re.S):
            assert "<script" not in svg and "http" not in svg.replace("http://www.w3.org", "")
