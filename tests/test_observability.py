"""Per-job metrics as the workers write them (SPEC section 12), and the
attempts a failed job's page shows, against a real Redis and real worker
processes."""

from __future__ import annotations

import signal
import time

from django_cogworker import metrics
from django_cogworker.api import metrics as api_metrics
from django_cogworker.connection import get_keys
from django_cogworker.metrics import BUCKETS_S, METRICS_TTL_S, Tally, bucket_of
from testproject.testapp import jobs
from tests.conftest import wait_for

RECORD = "testproject.testapp.jobs.record"
FAIL = "testproject.testapp.jobs.fail"  # retry=2: three runs, then dead
SLEEP = "testproject.testapp.jobs.sleep_then_record"


def minute_hashes(cog) -> dict[str, dict[str, metrics.JobFigures]]:
    k = get_keys()
    out = {}
    for key in cog.redis.scan_iter(match=f"{k.metrics_prefix}*"):
        name = key.decode()
        if name in (k.metrics_totals, k.deploy_marks):
            continue
        out[name] = metrics.parse(cog.redis.hgetall(name))[0]
    return out


def test_two_processes_figures_add_up_exactly_in_the_minutes_and_the_totals(cog):
    workers = [cog.start_worker("-c", "3"), cog.start_worker("-c", "3")]
    for worker in workers:
        worker.identity()  # both beat before any job is queued
    # More slow jobs than one process has threads: both processes run some.
    sleeping = [jobs.sleep_then_record.delay(0.2, "slow") for _ in range(8)]
    records = [jobs.record.delay(i) for i in range(30)]
    failing = [jobs.fail.delay(f"boom {i}") for i in range(4)]
    expected_runs = len(records) + 3 * len(failing) + len(sleeping)
    wait_for(lambda: len(cog.notes()) == expected_runs, 60, "every run")
    wait_for(lambda: cog.redis.zcard(get_keys().dead) == len(failing), 30, "the failing jobs in dead")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0
    ran_in = {
        int(line.split("[", 1)[1].split("]")[0])
        for w in workers
        for line in w.log().splitlines()
        if " done in " in line
    }
    assert len(ran_in) == 2, "both processes ran jobs"

    totals = api_metrics.totals().jobs
    assert (totals[RECORD].runs, totals[RECORD].failures) == (30, 0)
    assert (totals[FAIL].runs, totals[FAIL].failures) == (12, 12)
    assert (totals[SLEEP].runs, totals[SLEEP].failures) == (8, 0)
    for figures in totals.values():
        assert sum(figures.buckets) == figures.runs
    slow = totals[SLEEP]
    assert slow.total_s >= 8 * 0.2 and slow.mean_s >= 0.2
    assert sum(slow.buckets[: bucket_of(0.2)]) == 0, "each run took at least its sleep"

    per_minute = minute_hashes(cog)
    assert per_minute, "figures are kept per minute"
    for name in (RECORD, FAIL, SLEEP):
        summed = metrics.JobFigures(name)
        for figures in per_minute.values():
            if name in figures:
                summed.add(figures[name])
        assert (summed.runs, summed.failures, summed.time_us, summed.buckets) == (
            totals[name].runs,
            totals[name].failures,
            totals[name].time_us,
            totals[name].buckets,
        )
    for key in per_minute:
        assert 0 < cog.redis.ttl(key) <= METRICS_TTL_S
    assert cog.redis.ttl(get_keys().metrics_totals) == -1  # cumulative, for Prometheus counters

    window = api_metrics.summed(api_metrics.minutes(1))
    assert window[RECORD].runs == 30 and window[FAIL].failures == 12


def test_a_metrics_hash_of_the_wrong_type_loses_only_its_figures(cog):
    k = get_keys()
    cog.redis.set(k.metrics_totals, "not a hash")
    jobs.record.delay("x")
    worker = cog.start_worker()
    wait_for(lambda: cog.notes(), 20, "the job to run")
    time.sleep(1.0)  # a few beats (HEARTBEAT_INTERVAL 0.2 s) with the broken hash
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert cog.redis.get(k.stat_processed) == b"1", "the counters were written once, not again and again"
    assert "heartbeat failed" not in worker.log()
    assert sum(f.get(RECORD, metrics.JobFigures(RECORD)).runs for f in minute_hashes(cog).values()) == 1


def test_a_processed_counter_that_is_not_a_number_loses_only_itself_never_the_beat(cog):
    k = get_keys()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    cog.redis.set(k.stat_processed, "not a number")
    worker = cog.start_worker()
    identity = worker.identity()
    done = [jobs.record.delay(i) for i in range(3)]
    wait_for(lambda: len(cog.notes()) == 3, 20, "the jobs to run")
    # The beat carrying their counts lands in the day's counter, the
    # presence key lives on, and later beats keep coming.
    wait_for(lambda: cog.redis.get(k.stat_processed_on(today)) == b"3", 10, "the day's count")
    beat = cog.redis.hget(k.process(identity), "beat")
    wait_for(lambda: cog.redis.hget(k.process(identity), "beat") != beat, 10, "a later beat")
    assert cog.redis.ttl(k.process(identity)) > 0 and len(done) == 3
    assert cog.redis.get(k.stat_processed) == b"not a number"
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert cog.redis.get(k.stat_processed_on(today)) == b"3", "counted once, not given back and added again"
    assert "heartbeat failed" not in worker.log()


def test_tally_increments_merge_and_percentiles():
    tally = Tally()
    for took in (0.0005, 0.003, 0.003, 0.2, 400.0):
        tally.add("a", took, failed=took > 100)
    other = Tally()
    other.add("a", 0.003, failed=False)
    tally.merge(other)
    fields = dict(zip(tally.increments()[::2], tally.increments()[1::2], strict=True))
    assert fields["a|r"] == 6 and fields["a|f"] == 1
    assert fields[f"a|h{bucket_of(0.003)}"] == 3 and fields[f"a|h{len(BUCKETS_S)}"] == 1
    figures, malformed = metrics.parse({**{k: str(v) for k, v in fields.items()}, "junk": "1", "a|r2": "x"})
    assert malformed == 2 and figures["a"].runs == 6
    assert BUCKETS_S[bucket_of(0.003) - 1] < figures["a"].percentile(0.5) <= BUCKETS_S[bucket_of(0.003)]
    assert figures["a"].percentile(0.99) == BUCKETS_S[-1]  # the open-ended bucket: its lower bound


def test_a_dead_jobs_page_shows_each_attempt_with_its_start_and_duration(cog, superclient):
    jobs.fail.delay("three times")
    worker = cog.start_worker()
    wait_for(lambda: cog.redis.zcard(get_keys().dead) == 1, 30, "the job in dead")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    from django_cogworker import api

    record = next(iter(api.DeadSet()))
    attempts = record.payload["attempts"]
    assert [a["error"] for a in attempts] == ["ValueError"] * 3
    assert all(a["ran_s"] >= 0 for a in attempts)
    assert attempts[0]["started_at"] <= record.failed_at <= attempts[1]["started_at"]
    assert attempts[-1]["started_at"] <= record.retried_at
    starts = [a["started_at"] for a in attempts]
    assert starts == sorted(starts)
    from django_cogworker.admin.helpers import segment

    page = superclient.get(f"/admin/django_cogworker/job/dead/job/{segment(record.id)}/")
    assert page.status_code == 200
    html = page.content.decode()
    section = html.split('id="cog-attempts"', 1)[1].split("</table>", 1)[0]
    for number in (1, 2, 3):
        assert f"<tr><td>{number}</td>" in section
    assert section.count('<td class="cog-mono">ValueError</td>') == 3
