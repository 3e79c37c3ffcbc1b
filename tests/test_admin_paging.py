"""Pages that list what Redis holds stay bounded (issue 34 item 14): the
Metrics table and the Queues page are paginated and filtered by name, the
dashboard shows the largest queues; through Django's test client, against
a real Redis, with 10,000 job names and 20,000 queues."""

from __future__ import annotations

import re
import time
from html import unescape
from typing import Any

from django_cogworker.admin.helpers import PER_PAGE
from tests.test_metrics_page import BASE, minute_key, put, row_names, text

JOB = '{"jid": "j", "job": "app.x", "args": [], "kwargs": {}, "enqueued_at": 1}'


def many_job_names(cog: Any, count: int) -> None:
    """``count`` job names in the current minute, app.job00000 the slowest
    in total: the default order is by name."""
    pipe = cog.redis.pipeline(transaction=False)
    key = minute_key(cog, time.time())
    for i in range(count):
        name = f"app.job{i:05d}"
        pipe.hset(key, mapping={f"{name}|r": 1, f"{name}|us": 10_000_000 - i, f"{name}|h12": 1})
    pipe.execute()


def many_queues(cog: Any, count: int) -> None:
    """``count`` queues; queue i holds i % 7 jobs."""
    pipe = cog.redis.pipeline(transaction=False)
    for i in range(count):
        name = f"q{i:05d}"
        pipe.sadd(cog.key("queues"), name)
        if i % 7:
            pipe.rpush(cog.key(f"queue:{name}"), *[JOB] * (i % 7))
    pipe.execute()


def queue_names(body: str) -> list[str]:
    return [unescape(n) for n in re.findall(r'<td><a href="[^"]+/queues/[^"]+/">([^<]*)</a></td>', body)]


def test_the_metrics_table_is_paginated_keeping_the_sort_and_hours(cog, superclient):
    many_job_names(cog, 2 * PER_PAGE + 10)
    names = [f"app.job{i:05d}" for i in range(2 * PER_PAGE + 10)]
    first = superclient.get(BASE + "metrics/")
    assert row_names(text(first)) == names[:PER_PAGE]
    assert f"{len(names)} job names in the last 1 h" in text(first)
    last = superclient.get(BASE + "metrics/?hours=2&sort=runs&p=3")
    assert row_names(text(last)) == sorted(names)[2 * PER_PAGE :]  # runs tie: by name
    for query in ("?p=999999999999999999999", "?p=4"):
        assert row_names(text(superclient.get(BASE + "metrics/" + query))) == names[2 * PER_PAGE :]
    body = unescape(text(last))
    assert 'href="?hours=2&sort=runs&p=2"' in body  # the page links keep the sort and the hours
    assert 'href="?hours=4&sort=runs"' in body  # the hours and sort links go back to page 1


def test_the_metrics_table_is_filtered_by_job_name(cog, superclient):
    many_job_names(cog, 60)
    put(cog, time.time(), ("other.Report<b>", 0.1, False))
    response = superclient.get(BASE + "metrics/?q=JOB0005&sort=runs")
    assert row_names(text(response)) == [f"app.job{i:05d}" for i in range(50, 60)]
    assert "10 of 61 job names match" in unescape(text(response))
    assert row_names(text(superclient.get(BASE + "metrics/?q=report%3Cb"))) == ["other.Report<b>"]
    body = unescape(text(superclient.get(BASE + "metrics/?q=nothing-like-it")))
    assert 'No job name holds "nothing-like-it"' in body


def test_a_metrics_page_of_10000_job_names_is_one_page_of_them(cog, superclient):
    many_job_names(cog, 10_000)
    response = superclient.get(BASE + "metrics/")
    assert response.status_code == 200
    assert len(row_names(text(response))) == PER_PAGE
    assert len(response.content) < 300_000, len(response.content)
    assert "10,000 job names" in text(response)


def test_the_queues_page_is_paginated_and_filtered(cog, superclient):
    many_queues(cog, 2 * PER_PAGE + 10)
    names = sorted({f"q{i:05d}" for i in range(2 * PER_PAGE + 10)} | {"default"})
    first = superclient.get(BASE + "queues/")
    assert queue_names(text(first)) == names[:PER_PAGE]
    last = text(superclient.get(BASE + "queues/?p=3"))
    assert queue_names(last) == names[2 * PER_PAGE :]
    row = last.split(">q00059</a></td>", 1)[1].split("</tr>", 1)[0]
    assert "<td>3</td>" in row  # 59 % 7 jobs
    filtered = superclient.get(BASE + "queues/?q=Q0005")
    assert queue_names(text(filtered)) == [f"q{i:05d}" for i in range(50, 60)]


def test_a_queues_page_of_20000_queues_is_one_page_of_them(cog, superclient):
    many_queues(cog, 20_000)
    for url in ("queues/", "dashboard/"):
        response = superclient.get(BASE + url)
        assert response.status_code == 200
        assert len(response.content) < 300_000, (url, len(response.content))
    assert len(queue_names(text(superclient.get(BASE + "queues/")))) == PER_PAGE


def test_the_dashboard_shows_the_largest_queues(cog, superclient):
    many_queues(cog, 30)
    body = text(superclient.get(BASE + "dashboard/"))
    shown = queue_names(body)
    sizes = {f"q{i:05d}": i % 7 for i in range(30)}
    largest = sorted(sizes, key=lambda n: (-sizes[n], n))
    assert shown == largest[: len(shown)] and 0 < len(shown) < 31
    assert f"The {len(shown)} largest of 31 queues" in unescape(body)
