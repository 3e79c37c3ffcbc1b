"""The Prometheus endpoint ``django_cogworker.views.metrics`` (SPEC section
12), through Django's test client, against a real Redis: the exposition
parsed back with prometheus_client's own parser, who may read it, Redis
down, label escaping, and the cost of one scrape in round trips."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

from django_cogworker import limits, views
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.metrics import BUCKETS_S, Tally, write
from testproject.testapp import jobs
from tests.conftest import wait_for
from tests.test_api_limits import admit

URL = "/cogworker/metrics"
TOKEN = "s3cret-metrics-token"

# The endpoint as a project includes it (docs/observability.md).
urlpatterns = [path("cogworker/metrics", views.metrics)]
pytestmark = pytest.mark.urls(__name__)

FAMILIES = {
    # prometheus_client names a counter's family without its "_total".
    "cogworker_processed": "counter",
    "cogworker_failed": "counter",
    "cogworker_queue_size": "gauge",
    "cogworker_queue_latency_seconds": "gauge",
    "cogworker_retry_size": "gauge",
    "cogworker_dead_size": "gauge",
    "cogworker_scheduled_size": "gauge",
    "cogworker_unsettled_size": "gauge",
    "cogworker_processes": "gauge",
    "cogworker_busy_threads": "gauge",
    "cogworker_expired": "counter",
    "cogworker_limit_holders": "gauge",
    "cogworker_limit_waiting": "gauge",
    "cogworker_batches_open": "gauge",
    "cogworker_batch_callbacks": "counter",
    "cogworker_job_runs": "counter",
    "cogworker_job_duration_seconds": "histogram",
}


def scrape(client: Client | None = None, **headers: str) -> Any:
    return (client or Client()).get(URL, headers=headers)


def samples(response: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, parsed by prometheus_client: (name, sorted
    labels) -> value."""
    assert response.status_code == 200, response.content
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def add_figures(runs: list[tuple[str, float, bool]]) -> None:
    """Per-job figures in the totals hash, written as a worker writes them."""
    tally = Tally()
    for name, took_s, failed in runs:
        tally.add(name, took_s, failed)
    pipe = get_redis().pipeline(transaction=False)
    write(pipe, get_keys(), tally)
    pipe.execute()


def add_process(cog, identity: str, busy: int) -> None:
    cog.redis.sadd(cog.key("processes"), identity)
    cog.redis.hset(cog.key(f"process:{identity}"), mapping={"busy": busy, "beat": time.time()})


def make_user(name: str, *, staff: bool = True, active: bool = True, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, is_staff=staff, is_active=active)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_cogworker", codename=codename)
        )
    return user


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# -- what it says -----------------------------------------------------------------------


def test_every_figure_matches_what_redis_holds(cog):
    cog.configure(METRICS_TOKEN=TOKEN, QUEUES=["default", "mail"])
    now = time.time()
    cog.redis.set(cog.key("stat:processed"), 42)
    cog.redis.set(cog.key("stat:failed"), 5)
    cog.redis.zadd(cog.key("schedule"), {"s1": now + 60, "s2": now + 60, "s3": now + 60})
    cog.redis.zadd(cog.key("retry"), {"r1": now + 60, "r2": now + 60})
    cog.redis.zadd(cog.key("dead"), {"d1": now})
    cog.redis.rpush(cog.key("unsettled"), "u1", "u2", "u3", "u4")
    cog.redis.sadd(cog.key("queues"), "default", "low")
    # LPUSH: the oldest job is the last entry, the next to run.
    cog.redis.lpush(cog.key("queue:default"), json.dumps({"jid": "old", "enqueued_at": now - 30}))
    cog.redis.lpush(cog.key("queue:default"), json.dumps({"jid": "new", "enqueued_at": now - 1}))
    cog.redis.lpush(cog.key("queue:low"), json.dumps({"jid": "low", "enqueued_at": now - 5}))
    add_process(cog, "host:1:aaa", busy=3)
    add_process(cog, "host:2:bbb", busy=1)
    cog.redis.sadd(cog.key("processes"), "host:3:gone")  # its beat expired: not live
    add_figures(
        [("app.a", 0.002, False)] * 3 + [("app.a", 0.5, True), ("app.b", 400.0, False)],
    )

    response = scrape(Authorization=f"Bearer {TOKEN}")
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f.type for f in text_string_to_metric_families(response.content.decode())}
    assert families == FAMILIES
    got = samples(response)
    one = {name: got.pop((name, ())) for name, labels in list(got) if not labels}
    assert one == {
        "cogworker_processed_total": 42,
        "cogworker_failed_total": 5,
        "cogworker_scheduled_size": 3,
        "cogworker_retry_size": 2,
        "cogworker_dead_size": 1,
        "cogworker_unsettled_size": 4,
        "cogworker_processes": 2,
        "cogworker_busy_threads": 4,
        "cogworker_batches_open": 0,
    }
    sizes = {dict(labels)["queue"]: v for (name, labels), v in got.items() if name == "cogworker_queue_size"}
    assert sizes == {"default": 2, "low": 1, "mail": 0}  # "mail" from QUEUES, before its first job
    latency = {
        dict(labels)["queue"]: v
        for (name, labels), v in got.items()
        if name == "cogworker_queue_latency_seconds"
    }
    assert latency.keys() == {"default", "low", "mail"}
    assert 30 <= latency["default"] < 40 and 5 <= latency["low"] < 15 and latency["mail"] == 0

    def job(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert job("cogworker_job_runs_total", job="app.a", outcome="success") == 3
    assert job("cogworker_job_runs_total", job="app.a", outcome="failure") == 1
    assert job("cogworker_job_runs_total", job="app.b", outcome="success") == 1
    assert job("cogworker_job_runs_total", job="app.b", outcome="failure") == 0
    histogram = "cogworker_job_duration_seconds"
    a_buckets = [job(f"{histogram}_bucket", job="app.a", le=repr(b)) for b in BUCKETS_S]
    # Cumulative: 3 runs up to 2.5 ms, the 4th at 0.5 s (a bound is inclusive).
    assert a_buckets == [0, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]
    assert job(f"{histogram}_bucket", job="app.a", le="+Inf") == 4
    assert job(f"{histogram}_count", job="app.a") == 4
    assert job(f"{histogram}_sum", job="app.a") == pytest.approx(3 * 0.002 + 0.5)
    # Slower than the last bound: only in +Inf.
    assert job(f"{histogram}_bucket", job="app.b", le=repr(BUCKETS_S[-1])) == 0
    assert job(f"{histogram}_bucket", job="app.b", le="+Inf") == 1
    assert job(f"{histogram}_sum", job="app.b") == pytest.approx(400.0)
    text = response.content.decode()
    for name in ("cogworker_processed_total", "cogworker_queue_size", histogram):
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text


def test_an_empty_namespace_still_declares_every_family(cog):
    cog.configure(METRICS_TOKEN=TOKEN)
    response = scrape(Authorization=f"Bearer {TOKEN}")
    families = {f.name: f.type for f in text_string_to_metric_families(response.content.decode())}
    assert families == FAMILIES
    got = samples(response)
    assert got[("cogworker_processed_total", ())] == 0
    assert got[("cogworker_queue_size", (("queue", "default"),))] == 0
    assert not any(name.startswith("cogworker_job_") for name, _ in got)


def test_label_values_are_escaped(cog):
    cog.configure(METRICS_TOKEN=TOKEN)
    odd = 'app.say "hi" \\ back\nslash'
    add_figures([(odd, 0.01, True)])
    cog.redis.sadd(cog.key("queues"), 'q"uote')
    response = scrape(Authorization=f"Bearer {TOKEN}")
    text = response.content.decode()
    assert 'job="app.say \\"hi\\" \\\\ back\\nslash"' in text
    assert 'queue="q\\"uote"' in text
    got = samples(response)
    assert got[("cogworker_job_runs_total", (("job", odd), ("outcome", "failure")))] == 1
    assert got[("cogworker_job_duration_seconds_count", (("job", odd),))] == 1
    assert got[("cogworker_queue_size", (("queue", 'q"uote'),))] == 0


def test_limiters_holders_and_waiting_jobs(cog):
    cog.configure(METRICS_TOKEN=TOKEN)
    erp = limits.Concurrency("erp", 2)
    for i in range(5):
        admit(erp, f"e{i}", "default" if i < 4 else "mail")
    stripe = limits.Rate("stripe", 3, per=600)
    for i in range(4):
        admit(stripe, f"s{i}")
    odd = 'acct "7" \\ back'
    admit(limits.Concurrency(odd, 1), "o1")
    admit(limits.for_queue("reports", 1), "r1", "reports")
    response = scrape(Authorization=f"Bearer {TOKEN}")
    got = samples(response)

    def by_limit(name: str) -> dict[str, float]:
        return {dict(labels)["limit"]: v for (n, labels), v in got.items() if n == name}

    assert by_limit("cogworker_limit_holders") == {"erp": 2, "stripe": 3, odd: 1, "queue:reports": 1}
    assert by_limit("cogworker_limit_waiting") == {"erp": 3, "stripe": 1, odd: 0, "queue:reports": 0}
    assert 'limit="acct \\"7\\" \\\\ back"' in response.content.decode()


def test_limiter_garbage_in_redis_is_read_as_zeros_not_a_500(cog):
    cog.configure(METRICS_TOKEN=TOKEN)
    cog.redis.hset(cog.key("limits"), mapping={"erp": "not json", b"\xff": "{}", "x\ny": "{}"})
    cog.redis.set(cog.key("limit:erp:holders"), "not a hash")
    cog.redis.sadd(cog.key("limit:erp:queues"), b"\xed\xa0\x80")
    got = samples(scrape(Authorization=f"Bearer {TOKEN}"))
    assert got[("cogworker_limit_holders", (("limit", "erp"),))] == 0
    assert got[("cogworker_limit_waiting", (("limit", "erp"),))] == 0
    assert [labels for name, labels in got if name == "cogworker_limit_waiting"] == [(("limit", "erp"),)]
    cog.redis.delete(cog.key("limits"))
    cog.redis.set(cog.key("limits"), "not a hash")
    assert not any(
        name.startswith("cogworker_limit_") for name, _ in samples(scrape(Authorization=f"Bearer {TOKEN}"))
    )


def test_a_real_worker_run_shows_in_the_scrape(cog, in_process):
    cog.configure(METRICS_TOKEN=TOKEN, ENQUEUE_ON_COMMIT=False)
    for i in range(3):
        jobs.record.delay(i)
    jobs.fail_no_retry.delay()
    in_process(concurrency=2)
    runs = "cogworker_job_runs_total"

    def settled() -> dict[Any, float] | None:
        got = samples(scrape(Authorization=f"Bearer {TOKEN}"))
        failed = got.get((runs, (("job", "testproject.testapp.jobs.fail_no_retry"), ("outcome", "failure"))))
        return got if failed == 1 and got[("cogworker_processed_total", ())] == 4 else None

    got = wait_for(settled, 30, "the worker's figures in the scrape")
    assert got[(runs, (("job", "testproject.testapp.jobs.record"), ("outcome", "success")))] == 3
    assert got[("cogworker_failed_total", ())] == 1
    assert got[("cogworker_processes", ())] == 1


# -- who may read it --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("anonymous", 403),
        ("non-staff with view_job", 403),
        ("inactive staff with view_job", 403),
        ("staff without view_job", 403),
        ("staff with view_job", 200),
        ("staff with change_job", 200),  # the admin's rule: change implies view
        ("superuser", 200),
    ],
)
def test_sessions(cog, db, who, status):
    users = {
        "non-staff with view_job": lambda: make_user("plain", staff=False, perms=("view_job",)),
        "inactive staff with view_job": lambda: make_user("gone", active=False, perms=("view_job",)),
        "staff without view_job": lambda: make_user("staffer"),
        "staff with view_job": lambda: make_user("viewer", perms=("view_job",)),
        "staff with change_job": lambda: make_user("operator", perms=("change_job",)),
        "superuser": lambda: User.objects.create_superuser("root", email=None, password=None),
    }
    client = logged_in(users[who]()) if who in users else Client()
    response = scrape(client)
    assert response.status_code == status
    if status == 403:
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert b"cogworker_" not in response.content


@pytest.mark.parametrize(
    ("configured", "header", "status"),
    [
        (TOKEN, f"Bearer {TOKEN}", 200),
        (TOKEN, f"bearer {TOKEN}", 200),  # the scheme is case-insensitive (RFC 7235)
        (TOKEN, "Bearer wrong-token", 403),
        (TOKEN, f"Bearer {TOKEN}x", 403),
        (TOKEN, "Bearer ", 403),
        (TOKEN, f"Basic {TOKEN}", 403),
        (TOKEN, TOKEN, 403),
        (None, f"Bearer {TOKEN}", 403),  # no token configured: staff sessions only
        (None, "Bearer None", 403),
        (None, "Bearer ", 403),
        ("", "Bearer ", 403),  # an empty token (E027) matches nothing, not an empty header
        ("", "Bearer", 403),
        # Read from a file with its newline: stripped, as the header's credentials are.
        (f"{TOKEN}\n", f"Bearer {TOKEN}", 200),
        (f"  {TOKEN}\t", f"Bearer {TOKEN}", 200),
        (" \n", "Bearer ", 403),  # only whitespace (E027): no token at all
    ],
)
def test_bearer_tokens(cog, configured, header, status):
    cog.configure(METRICS_TOKEN=configured)
    assert scrape(Authorization=header).status_code == status


def test_only_get_and_head_and_never_cached(cog):
    cog.configure(METRICS_TOKEN=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert Client().head(URL, headers=auth).status_code == 200
    assert Client().post(URL, headers=auth).status_code == 405
    assert "no-store" in scrape(**auth)["Cache-Control"]


# -- Redis down -------------------------------------------------------------------------


def test_redis_down_answers_503_with_the_address_masked(cog, own_redis, db):
    server = own_redis()
    server.stop()
    cog.configure(METRICS_TOKEN=TOKEN, REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
    superuser = logged_in(User.objects.create_superuser("root", email=None, password=None))
    for response in (scrape(superuser), scrape(Authorization=f"Bearer {TOKEN}")):
        assert response.status_code == 503
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        body = response.content.decode()
        assert (
            body
            == f"503 Service Unavailable: Redis is unreachable at redis://:***@127.0.0.1:{server.port}/0.\n"
        )
        assert "s3cret-pw" not in body
    # Refused before Redis is asked: the 403 does not wait for Redis.
    assert scrape(Authorization="Bearer wrong").status_code == 403


# -- what one scrape costs --------------------------------------------------------------


class RoundTrips:
    """Counts the round trips of the real client: each command sent alone,
    and each pipeline that sends something (redis-py sends nothing for an
    empty one). Wraps the calls; the commands still run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, client: Any) -> None:
        self.count = 0
        send_one = client.execute_command

        def counted_command(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return send_one(*args, **kwargs)

        pipeline_class = type(client.pipeline(transaction=False))
        send_many = pipeline_class.execute

        def counted_execute(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            if pipe.command_stack:
                self.count += 1
            return send_many(pipe, *args, **kwargs)

        monkeypatch.setattr(client, "execute_command", counted_command)
        monkeypatch.setattr(pipeline_class, "execute", counted_execute)


def fill(cog, jobs_n: int, queues_n: int, processes_n: int, limiters_n: int) -> None:
    add_figures([(f"app.job_{i}", 0.01 * i, i % 3 == 0) for i in range(jobs_n)])
    for i in range(limiters_n):
        # One holder and one waiting job each, the waiting one on a queue of its own.
        limiter = limits.Rate(f"r{i}", 1, per=600) if i % 2 else limits.Concurrency(f"c{i}", 1)
        admit(limiter, f"h{i}")
        admit(limiter, f"w{i}", f"q{i}")
    for i in range(queues_n):
        cog.redis.sadd(cog.key("queues"), f"q{i}")
        cog.redis.lpush(cog.key(f"queue:q{i}"), json.dumps({"enqueued_at": time.time() - i}))
    for i in range(processes_n):
        add_process(cog, f"host:{i}:x", busy=1)


def test_one_scrape_costs_the_same_round_trips_for_1_or_50_job_names(cog, monkeypatch):
    cog.configure(METRICS_TOKEN=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    fill(cog, jobs_n=1, queues_n=1, processes_n=1, limiters_n=2)
    trips = RoundTrips(monkeypatch, get_redis())
    small = samples(scrape(**auth))
    few = trips.count

    fill(cog, jobs_n=50, queues_n=30, processes_n=20, limiters_n=40)
    trips.count = 0
    large = samples(scrape(**auth))
    many = trips.count

    assert len([k for k in small if k[0] == "cogworker_job_runs_total"]) == 2
    assert len([k for k in large if k[0] == "cogworker_job_runs_total"]) == 100
    assert large[("cogworker_processes", ())] == 20
    assert large[("cogworker_limit_waiting", (("limit", "r39"),))] == 1
    assert len([k for k in large if k[0] == "cogworker_limit_holders"]) == 40
    # Seven, four for the limiters (their registry, two pipelines, Redis's
    # clock) and one for the batches.
    assert few == many <= 12, "the round trips of one scrape grow with the data"


def test_without_limiters_a_scrape_costs_one_round_trip_more(cog, monkeypatch):
    cog.configure(METRICS_TOKEN=TOKEN)
    trips = RoundTrips(monkeypatch, get_redis())
    samples(scrape(Authorization=f"Bearer {TOKEN}"))
    assert trips.count <= 8
