"""The jobs admin in a real browser: headless Chromium (Debian's package)
driven by Playwright, against a live server, a real Redis and a real worker.

Logs in, opens the dead page, filters, retries a job and sees it leave the
set; selects every job matching a filter across pages and deletes them;
pauses the auto-refresh. Saves a screenshot of every page under
``test-artifacts/admin/``; with ``COGWORKER_DOCS_SCREENSHOTS=1`` also copies
them to ``docs/img/admin-*.png`` (the screenshots of the documentation).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import sync_playwright

from django_cogworker import api, metrics
from django_cogworker.layouts import keys
from django_cogworker.payload import encode
from testproject.testapp import jobs
from tests.conftest import ROOT, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts" / "admin"
DOCS_IMG = ROOT / "docs" / "img"
BASE = "/admin/django_cogworker/job/"
PASSWORD = "correct horse battery staple"


# -- data that looks like a day in production ---------------------------------------------

DEAD_KINDS = [
    ("shop.mail.send_receipt", "mail", "SMTPServerDisconnected", "Connection unexpectedly closed"),
    ("shop.billing.charge_card", "mail", "CardDeclined", "card_declined: insufficient funds"),
    (
        "shop.reports.build_monthly",
        "low",
        "ProcessDied",
        "the job's process died 3 times while running it (out of memory? SIGKILL?)",
    ),
]


def _payload(jid: str, job: str, queue: str, args: list[Any], **fields: Any) -> bytes:
    now = time.time()
    return encode(
        {
            "jid": jid,
            "job": job,
            "args": args,
            "kwargs": {},
            "queue": queue,
            "retry": 5,
            "created_at": now - 7200,
            "enqueued_at": now - 7100,
            **fields,
        }
    )


def _failure(error_class: str, message: str, count: int) -> dict[str, Any]:
    return {
        "retry_count": count,
        "error_class": error_class,
        "error_message": message,
        "error_backtrace": [
            'File "/srv/shop/jobs.py", line 42, in run',
            "    result = gateway.call(order)",
            f'File "/srv/shop/gateway.py", line 118, in call\n    raise {error_class}(...)',
        ],
        "failed_at": time.time() - 60 * count,
    }


def fill_unsettled(cog) -> None:
    """Failed jobs a stopping process could not file (any live process files them)."""
    for i in range(2):
        payload = _payload(
            f"unset{i:03d}aa11bb22cc33",
            "shop.billing.charge_card",
            "mail",
            [i],
            **_failure("TimeoutError", "gateway timed out", 1),
        )
        entry = {"payload": payload.decode(), "set": "retry", "score": time.time() + 20}
        cog.redis.rpush(cog.key("unsettled"), json.dumps(entry))


def fill(cog) -> None:
    now = time.time()
    r = cog.redis
    pipe = r.pipeline(transaction=False)
    for i in range(45):
        job, queue, error_class, message = DEAD_KINDS[i % 3]
        pipe.zadd(
            cog.key("dead"),
            {
                _payload(
                    f"dead{i:03d}aa11bb22cc33", job, queue, [1000 + i], **_failure(error_class, message, 5)
                ): now - 137 * i
            },
        )
    # A payload carrying HTML: shown as text, never run as markup.
    pipe.zadd(
        cog.key("dead"),
        {
            _payload(
                "deadhtml0000000000000000",
                "shop.mail.send_receipt",
                "mail",
                ["<img src=x onerror=alert(1)>"],
                **_failure("ValueError", "<b>not bold</b> & <script>alert('x')</script>", 5),
            ): now - 30
        },
    )
    for i in range(12):
        job, queue, error_class, message = DEAD_KINDS[i % 2]
        pipe.zadd(
            cog.key("retry"),
            {
                _payload(
                    f"retry{i:03d}aa11bb22cc33", job, queue, [i], **_failure(error_class, message, i % 5)
                ): now + 30 + 90 * i
            },
        )
    for i in range(8):
        pipe.zadd(
            cog.key("schedule"),
            {
                _payload(f"sched{i:03d}aa11bb22cc33", "shop.mail.send_reminder", "mail", [i, "tomorrow"]): now
                + 3600 * (i + 1)
            },
        )
    for queue, count in (("mail", 14), ("low", 230)):
        pipe.sadd(cog.key("queues"), queue)
        for i in range(count):
            pipe.lpush(
                cog.key(f"queue:{queue}"),
                _payload(
                    f"{queue}{i:04d}aa11bb22cc33", f"shop.{queue}.task", queue, [i], enqueued_at=now - 300 + i
                ),
            )
    pipe.sadd(cog.key("paused"), "low")
    today = dt.datetime.now(dt.UTC).date()
    total_processed = total_failed = 0
    for back in range(90):
        day = (today - dt.timedelta(days=back)).isoformat()
        processed = (
            4000 + (back * 7919) % 2500 - (800 if (today - dt.timedelta(days=back)).weekday() > 4 else 0)
        )
        failed = (back * 37) % 60 + (400 if back == 4 else 0)
        total_processed += processed
        total_failed += failed
        pipe.set(cog.key(f"stat:processed:{day}"), processed)
        pipe.set(cog.key(f"stat:failed:{day}"), failed)
    pipe.set(cog.key("stat:processed"), total_processed)
    pipe.set(cog.key("stat:failed"), total_failed)
    pipe.execute()


# -- browser ------------------------------------------------------------------------------


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A browser context with a fresh profile. Opened after the database
    work: Playwright's sync API runs an event loop in this thread, where
    Django refuses ORM calls."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (see docs/admin.md)")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,  # a fresh --user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1360, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


class Shots:
    def __init__(self) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.update_docs = os.environ.get("COGWORKER_DOCS_SCREENSHOTS") == "1"
        self.taken: list[str] = []

    def take(self, page: Any, name: str, *, full_page: bool = True) -> None:
        path = ARTIFACTS / f"admin-{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        if self.update_docs:
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOCS_IMG / path.name)
        self.taken.append(path.name)


def login(page: Any, base_url: str, next_path: str) -> None:
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}{next_path}")


def dead_jids(cog) -> set[str]:
    return {json.loads(raw)["jid"] for raw in cog.redis.zrange(cog.key("dead"), 0, -1)}


def test_admin_in_a_real_browser(cog, live_server, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a fast login
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    fill(cog)
    worker = cog.start_worker()
    worker.identity()
    jobs.sleep_then_record.delay(60, "import-catalogue")
    jobs.sleep_then_record.delay(60, "rebuild-search-index")
    wait_for(lambda: len(api.Workers().all()) == 2, 20, "two jobs to be running")
    if hasattr(api, "PeriodicEntries"):
        # After the worker started: only this process (the admin) knows them.
        cog.configure(
            PERIODIC=[
                {"cron": "*/15 * * * *", "job": jobs.record.name, "args": ["refresh-rates"]},
                {
                    "cron": "0 3 * * *",
                    "job": jobs.record.name,
                    "args": ["nightly-cleanup"],
                    "until_executed": True,
                },
            ]
        )

    with chromium() as browser_context:
        check_pages(cog, worker, live_server.url, browser_context.new_page())


def check_pages(cog, worker, url: str, page: Any) -> None:
    shots = Shots()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: errors.append("dialog: " + dialog.message))

    # Log in; the dead page.
    login(page, url, BASE + "dead/")
    assert page.locator("#result_list tbody tr").count() == 25
    assert "46 jobs" in page.locator("p.paginator").inner_text()
    html_row = page.locator("tr", has_text="deadhtml0000000000000000")
    assert "<b>not bold</b>" in html_row.inner_text()  # shown as text
    assert page.locator("#result_list b").count() == 0
    shots.take(page, "dead")

    # Filter by job name (15 billing jobs), then retry one of them.
    page.fill("#cog-filter-name", "shop.billing.charge_card")
    page.click("#changelist-search input[type=submit]")
    page.wait_for_url("**/dead/?name=shop.billing.charge_card*")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 15
    assert all("shop.billing.charge_card" in t for t in rows.all_inner_texts())
    shots.take(page, "dead-filtered")
    target = "dead001aa11bb22cc33"
    assert target in dead_jids(cog)
    page.locator(f'input[aria-label="Select job {target}"]').check()
    assert page.locator("span.action-counter").inner_text() == "1 of 15 selected"
    page.select_option("select[name=action]", "retry")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure?")
    assert target in page.locator("#content").inner_text()
    shots.take(page, "confirm")
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Retried 1 of 1 jobs" in page.locator("ul.messagelist").inner_text()
    assert target not in page.locator("#result_list").inner_text()
    assert page.locator("#result_list tbody tr").count() == 14
    assert target not in dead_jids(cog)
    assert target in [json.loads(r)["jid"] for r in cog.redis.lrange(cog.key("queue:mail"), 0, -1)]

    # One job's page.
    page.click("#result_list tbody tr:nth-child(1) th a")
    page.wait_for_selector("text=Backtrace")
    assert "CardDeclined" in page.locator("#content").inner_text()
    shots.take(page, "job")

    # Filter by queue; then select every job across pages ("Select all 45
    # jobs"), ask to delete them, and step back at the confirmation.
    page.goto(f"{url}{BASE}dead/")
    page.fill("#cog-filter-queue", "low")
    page.click("#changelist-search input[type=submit]")
    page.wait_for_url("**/dead/?*queue=low*")
    assert page.locator("#result_list tbody tr").count() == 15
    page.goto(f"{url}{BASE}dead/")
    page.click("#action-toggle")
    page.click("span.question a")
    assert page.locator("span.all").is_visible()
    page.select_option("select[name=action]", "delete")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure?")
    assert "45 jobs now" in page.locator("#content").inner_text()
    page.click("a.cancel-link")  # changed our mind: nothing deleted
    page.wait_for_url(f"{url}{BASE}dead/")
    assert len(dead_jids(cog)) == 45

    # The other pages.
    page.goto(f"{url}{BASE}dashboard/")
    page.wait_for_selector("#cog-history svg.cog-chart rect.processed")
    assert page.locator("svg.cog-chart rect.day").count() == 30
    assert page.locator("#cog-last-hour svg.cog-chart rect.minute").count() == 60
    page.click("#cog-refresh-toggle")  # pause the auto-refresh, so the shots are steady
    assert page.locator("#cog-refresh-toggle").inner_text() == "Resume"
    page.reload()
    assert page.locator("#cog-refresh-toggle").inner_text() == "Resume"  # kept across reloads
    shots.take(page, "dashboard")
    page.goto(f"{url}{BASE}dashboard/?days=90")
    assert page.locator("svg.cog-chart rect.day").count() == 90

    page.goto(f"{url}{BASE}queues/")
    assert "paused" in page.locator("tr", has_text="low").inner_text().lower()
    shots.take(page, "queues")
    page.click("a:text('mail')")
    page.wait_for_url("**/queues/mail/")
    shots.take(page, "queue")
    page.goto(f"{url}{BASE}queues/")
    page.locator("tr", has_text="mail").locator("a:text('Clear…')").click()
    page.wait_for_selector("text=Yes, clear the queue")
    shots.take(page, "queue-clear")

    page.goto(f"{url}{BASE}busy/")
    assert "sleep_then_record" in page.locator("#content").inner_text()
    assert str(worker.pid) in page.locator("#content").inner_text()
    shots.take(page, "busy")

    # Without a live process, unsettled jobs stay unsettled: show some.
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    fill_unsettled(cog)

    for name in ("scheduled", "retries", "unsettled", "periodic"):
        page.goto(f"{url}{BASE}{name}/")
        page.wait_for_selector("nav[aria-label=Jobs]")
        shots.take(page, name)
    if hasattr(api, "PeriodicEntries"):
        assert "*/15 * * * *" in page.locator("#content").inner_text()

    page.goto(f"{url}/admin/")
    shots.take(page, "index", full_page=False)

    # Dark mode: the admin's own colours, the chart's too.
    page.emulate_media(color_scheme="dark")
    page.goto(f"{url}{BASE}dashboard/")
    shots.take(page, "dashboard-dark")
    page.goto(f"{url}{BASE}dead/")
    shots.take(page, "dead-dark")

    # The metrics tab (dark, then light) and one job's page, with a deploy mark.
    fill_metrics(cog)
    page.goto(f"{url}{BASE}metrics/")
    shots.take(page, "metrics-dark")
    page.emulate_media(color_scheme="light")
    page.goto(f"{url}{BASE}metrics/")
    assert page.locator("#cog-metrics-jobs tbody tr").count() == len(METRIC_JOBS)
    first_row = page.locator("#cog-metrics-jobs tbody tr:nth-child(1) th").inner_text()
    assert first_row == "shop.reports.build_monthly"  # the most total time
    assert page.locator("#cog-metrics-runs svg.cog-chart rect.minute").count() == 60
    assert page.locator("svg.cog-chart g.mark").count() == 1
    shots.take(page, "metrics")
    if shots.update_docs:
        shutil.copyfile(ARTIFACTS / "admin-metrics.png", DOCS_IMG / "metrics.png")
    page.click("#cog-metrics-jobs a:text('shop.billing.charge_card')")
    page.wait_for_url("**/metrics/shop.billing.charge_card/?hours=1")
    assert page.locator("svg.cog-chart g.mark").count() == 2  # runs and mean
    assert page.locator("#cog-job-histogram svg rect.mean").count() == len(metrics.BUCKETS_S) + 1
    shots.take(page, "metrics-job")

    assert errors == []
    assert len(shots.taken) == 19


#: Job names of the metrics page's data: (name, seconds a run takes, every how
#: many runs one fails (0: none), runs per minute).
METRIC_JOBS = [
    ("shop.mail.send_receipt", 0.08, 0, 24),
    ("shop.billing.charge_card", 0.45, 12, 9),
    ("shop.reports.build_monthly", 14.0, 0, 1),
    ("shop.search.reindex", 1.2, 40, 3),
    ("shop.mail.send_reminder", 0.012, 0, 30),
]


def fill_metrics(cog) -> None:
    """An hour of per-job figures, as workers write them, and a deploy 25
    minutes ago after which card charges got slower."""
    now = time.time()
    pipe = cog.redis.pipeline(transaction=False)
    for back in range(60):
        tally = metrics.Tally()
        for j, (name, took_s, fail_every, per_minute) in enumerate(METRIC_JOBS):
            slower = 2.2 if name == "shop.billing.charge_card" and back < 25 else 1.0
            busy = 1 + 0.4 * math.sin(back / 7 + j)  # traffic comes and goes
            for i in range(max(0, round(per_minute * busy) + (back * 7 + j * 3) % 5 - 2)):
                spread = 0.5 + ((back * 31 + i * 17 + j) % 100) / 80
                failed = bool(fail_every) and (back * per_minute + i) % fail_every == 0
                tally.add(name, took_s * spread * slower, failed)
        metrics.write(pipe, keys(cog.namespace), tally, now - 60 * back)
    pipe.execute()
    api.mark_deploy("v1.4.2", at=now - 25 * 60)
    api.mark_deploy("v1.4.1", at=now - 3 * 3600)  # not in the last hour
