"""Limiters (SPEC section 14, G23) with real worker processes on a real
Redis: never more than N at once, never faster than R, across processes;
a job over its limit waits (no retry, no failure) at a bounded cost.

The faults (SIGKILL, SIGSTOP, SIGTERM of a holder) are in
``tests/test_limits_chaos.py``. Each test prints the figures it measured.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testproject.testapp import jobs, limited_jobs
from tests.conftest import CogEnv, Worker, wait_for
from tests.test_expires import skewed_env

#: What a worker logs when a step of a limiter failed (the job then
#: waits for the stray check or a sweep instead).
LIMIT_FAULTS = ("could not park", "could not admit", "could not release", "could not wake", "Traceback")

#: How long a wait may go without a job making progress.
STALL_S = 30


def gauge_max(cog: CogEnv, gauge: str) -> int:
    """The most runs of ``gauge``'s kind seen at once (limited_jobs._gauged)."""
    return int(cog.redis.get(cog.key(f"test:gauge:{gauge}:max")) or 0)


def failed_count(cog: CogEnv) -> int:
    return int(cog.redis.get(cog.key("stat:failed")) or 0)


def holders(cog: CogEnv, name: str = "erp") -> int:
    return int(cog.redis.hlen(cog.key(f"limit:{name}:holders")))


def waiting_keys(cog: CogEnv) -> list[bytes]:
    return list(cog.redis.scan_iter(match=cog.key("limit:*:waiting:*")))


def tags(cog: CogEnv, kind: str = "runs") -> list[Any]:
    return [note["tag"] for note in cog.notes(kind)]


def start_workers(cog: CogEnv, count: int, *args: str, **overrides: Any) -> list[Worker]:
    workers = [cog.start_worker(*args, **overrides) for _ in range(count)]
    for worker in workers:
        worker.identity()
    return workers


def wait_all_run(cog: CogEnv, expected: set[Any], what: str, kind: str = "runs") -> None:
    """Until every tag in ``expected`` has a ``kind`` note; the wait fails
    only when no note is added for ``STALL_S``."""
    wait_for(
        lambda: expected <= set(tags(cog, kind)),
        STALL_S,
        what,
        progress=lambda: cog.redis.llen(cog.key(f"test:{kind}")),
    )


def assert_settled(cog: CogEnv, name: str = "erp") -> None:
    """Nothing held, nothing waiting, no process holding a slot; no worker
    logged a limiter's step that failed."""
    for worker in cog.workers:
        log = worker.log()
        for fault in LIMIT_FAULTS:
            assert fault not in log, f"{fault!r} in {worker.log_path.name}"
    wait_for(lambda: holders(cog, name) == 0, 15, f"limiter {name}'s holders back to 0")
    assert waiting_keys(cog) == []
    assert list(cog.redis.scan_iter(match=cog.key("limits:held:*"))) == []
    # No reservation left behind to hold a slot back (PROMOTED_TTL_S).
    assert cog.redis.zcard(cog.key(f"limit:{name}:promoted")) == 0


@contextmanager
def sampling(cog: CogEnv, name: str = "erp") -> Iterator[list[int]]:
    """Samples HLEN of the limiter's holders every few milliseconds while
    the block runs; the samples are in the list yielded."""
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(holders(cog, name))
            done.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(5)


# -- concurrency -----------------------------------------------------------------------------


def test_g23_concurrency_holds_across_processes_and_waiting_uses_no_retry(cog: CogEnv) -> None:
    start_workers(cog, 3, CONCURRENCY=4)
    expected = set(range(60))
    with sampling(cog) as seen:
        for i in sorted(expected):
            limited_jobs.erp_sync.delay(0.2, i)
        wait_all_run(cog, expected, "60 limited jobs to run")
    runs = cog.notes()
    assert sorted(n["tag"] for n in runs) == sorted(expected), "each ran exactly once"
    assert {n["retry_count"] for n in runs} == {0}
    assert failed_count(cog) == 0
    # The gauge counts runs inside the function from every process: 2, never more.
    assert gauge_max(cog, "erp") == 2
    assert max(seen) <= 2
    assert len({n["pid"] for n in runs}) >= 2, "the jobs ran in several processes"
    assert_settled(cog)
    print(f"\nConcurrency(2), 3 processes x 4 threads, 60 jobs: max at once {gauge_max(cog, 'erp')}")


def test_g23_basic_fetch_honours_a_concurrency_limit(cog: CogEnv) -> None:
    start_workers(cog, 2, CONCURRENCY=4, FETCH="basic")
    expected = set(range(20))
    for i in sorted(expected):
        limited_jobs.erp_sync.delay(0.1, i)
    wait_all_run(cog, expected, "20 limited jobs under basic fetch")
    assert sorted(tags(cog)) == sorted(expected)
    assert gauge_max(cog, "erp") == 2
    assert failed_count(cog) == 0
    assert_settled(cog)
    print(f"\nbasic fetch, Concurrency(2): max at once {gauge_max(cog, 'erp')}")


def test_g23_queue_limit_one_at_a_time_and_other_queues_run_meanwhile(cog: CogEnv) -> None:
    cog.configure(QUEUES=["low", "default"], QUEUE_LIMITS={"low": 1})
    start_workers(cog, 2, CONCURRENCY=4)
    reports = {f"r{i}" for i in range(6)}
    others = {f"o{i}" for i in range(10)}
    # One at a time, the last report starts 5 x 0.8 s after the first: the
    # other queue's ten quick jobs end before it on a loaded machine too.
    for tag in sorted(reports):
        limited_jobs.report.delay(0.8, tag)
    for tag in sorted(others):
        jobs.record.delay(tag)
    wait_all_run(cog, reports | others, "the reports and the other queue's jobs")
    assert gauge_max(cog, "reports") == 1
    notes = cog.notes()
    assert sorted(n["tag"] for n in notes) == sorted(reports | others)
    last_report_start = max(n["at"] for n in cog.notes("started") if n["tag"] in reports)
    last_other = max(n["at"] for n in notes if n["tag"] in others)
    # The default queue's jobs did not wait behind the reports.
    assert last_other < last_report_start
    assert failed_count(cog) == 0
    assert_settled(cog, "queue:low")
    print(f"\nQUEUE_LIMITS low=1, 2 processes: max at once {gauge_max(cog, 'reports')}")


def test_g23_dynamic_limit_per_account_serial_accounts_parallel_names_forgotten(cog: CogEnv) -> None:
    start_workers(cog, 2, CONCURRENCY=4)
    accounts = [1, 2, 3]
    expected = {f"a{a}-{i}" for a in accounts for i in range(4)}
    for i in range(4):
        for a in accounts:
            limited_jobs.import_account.delay(a, 0.3, f"a{a}-{i}")
    wait_all_run(cog, expected, "every account's imports")
    assert sorted(tags(cog)) == sorted(expected)
    for a in accounts:
        assert gauge_max(cog, f"account:{a}") == 1, f"account {a} ran two at once"
    # Accounts in parallel: some run of one account overlaps a run of another.
    starts = {n["tag"]: n["at"] for n in cog.notes("started")}
    spans = [(starts[n["tag"]], n["at"], n["tag"].split("-")[0]) for n in cog.notes()]
    assert any(s1 < e2 and s2 < e1 and a1 != a2 for s1, e1, a1 in spans for s2, e2, a2 in spans)
    # The sweep (each poller pass) forgets the idle names: no key left per account.
    wait_for(
        lambda: (
            not list(cog.redis.scan_iter(match=cog.key("limit:account:*")))
            and not any(name.startswith(b"account:") for name in cog.redis.hkeys(cog.key("limits")))
        ),
        15,
        "the account limiters forgotten",
    )
    assert list(cog.redis.scan_iter(match=cog.key("limits:held:*"))) == []


def test_g23_acquire_in_job_code_waits_and_runs_again_from_its_start(cog: CogEnv) -> None:
    start_workers(cog, 2, CONCURRENCY=4)
    expected = set(range(6))
    for i in sorted(expected):
        limited_jobs.code_limited.delay(0.3, i)
    wait_all_run(cog, expected, "the jobs limited in their code")
    runs = cog.notes()
    assert sorted(n["tag"] for n in runs) == sorted(expected)
    entered = cog.notes("entered")
    # Some met the full limiter and ran again from their start...
    assert len(entered) > len(expected)
    # ...as the same try: no retry used, nothing failed.
    assert {n["retry_count"] for n in runs + entered} == {0}
    assert failed_count(cog) == 0
    assert gauge_max(cog, "in-code") == 1
    assert_settled(cog, "in-code")
    print(f"\nacquire() in job code, Concurrency(1): 6 jobs entered {len(entered)} times, max at once 1")


def test_g23_expires_drops_a_job_that_waited_past_its_deadline(cog: CogEnv) -> None:
    start_workers(cog, 1, CONCURRENCY=4)
    # The holders outlast the late job's deadline (1 s after its enqueue)
    # even when a loaded machine delays that enqueue by seconds.
    for i in range(2):
        limited_jobs.erp_sync.delay(6, f"holder{i}")
    wait_for(lambda: holders(cog) == 2, 15, "both slots held")
    limited_jobs.erp_sync.set(expires_in=1).delay(0.1, "late")
    limited_jobs.erp_sync.delay(0.1, "patient")
    wait_for(lambda: waiting_keys(cog), 15, "the two to wait")
    wait_all_run(cog, {"holder0", "holder1", "patient"}, "the holders and the patient job")
    wait_for(
        lambda: int(cog.redis.get(cog.key("stat:expired")) or 0) == 1, 15, "the late job counted expired"
    )
    assert "late" not in tags(cog) + tags(cog, "started")
    assert failed_count(cog) == 0
    assert_settled(cog)


# -- rate -----------------------------------------------------------------------------------


def most_in_a_window(times: list[float], per: float) -> int:
    """The most of ``times`` in any window [t, t + per)."""
    times = sorted(times)
    return max(sum(1 for u in times if t <= u < t + per) for t in times)


@pytest.mark.parametrize("skew_s", [0, 3600], ids=["clock-right", "clock-an-hour-ahead"])
def test_g23_rate_no_window_holds_more_than_its_starts(cog: CogEnv, tmp_path: Path, skew_s: int) -> None:
    cog.start_worker(CONCURRENCY=4).identity()
    # A second worker whose clock is an hour off (or not): the rate is on Redis's clock.
    cog.start_worker(env=skewed_env(tmp_path, skew_s), CONCURRENCY=4).identity()
    expected = set(range(20))
    for i in sorted(expected):
        limited_jobs.charge.delay(i)
    wait_all_run(cog, expected, "20 rate-limited jobs")
    runs = cog.notes()
    assert sorted(n["tag"] for n in runs) == sorted(expected)
    admitted = [n["admitted_at"] for n in runs]
    assert None not in admitted
    # The limiter's own record of the starts: never more than 5 in a second.
    assert most_in_a_window(admitted, 1.0) <= 5
    # Where each run noted its start: a few ms after its admission, so
    # compared over a window shorter by that much.
    recorded = [n["redis_at"] for n in runs]
    assert most_in_a_window(recorded, 0.95) <= 5
    # The rate did bind: 20 starts at 5 a second span at least 3 seconds.
    assert max(admitted) - min(admitted) >= 3.0
    assert {n["retry_count"] for n in runs} == {0}
    assert failed_count(cog) == 0
    assert waiting_keys(cog) == []
    print(
        f"\nRate(5, per=1), 20 jobs, skew {skew_s}s: most starts in 1 s {most_in_a_window(admitted, 1.0)}, "
        f"span {max(admitted) - min(admitted):.2f}s"
    )
