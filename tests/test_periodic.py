"""Periodic jobs: the schedule as pure functions, the ticker against a real
Redis (with an injected clock), and real worker processes racing for slots."""

from __future__ import annotations

import itertools
import json
import logging
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from django_cogworker import api, job, periodic, registry, testing
from django_cogworker.checks import check_settings
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.cron import Schedule, cron_error, tz_error
from django_cogworker.execution import execute
from django_cogworker.payload import encode
from django_cogworker.periodic.enqueue import ALREADY, PUSHED, SKIPPED, SLOT_MARKER_TTL_S
from django_cogworker.periodic.entry import Entry, parse_setting
from django_cogworker.periodic.lock import ACTIVE_TTL_MIN_S, HELD, active_ttl_s
from django_cogworker.periodic.ticker import LATE_GRACE_S, Ticker
from django_cogworker.requeue import PERIODIC_QUEUED_TTL_S
from tests.conftest import wait_for

RECORD = "testproject.testapp.jobs.record"
SLEEP = "testproject.testapp.jobs.sleep_then_record"
BLOCK = "testproject.testapp.jobs.block_first_run"
PLAIN_JSON = "pass plain JSON values (str, int, float, bool, None, list, dict), such as a model's pk."
NOTE_RUNS = {"client": [], "server": ["testproject.testapp.middleware.NoteRuns"]}


def ts(text: str) -> float:
    """Epoch seconds of an ISO time, or of "MM-DD hh:mm:ss" in 2024, UTC."""
    if len(text) == 14:
        text = f"2024-{text}+00:00"
    return datetime.fromisoformat(text).timestamp()


def iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def short(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).strftime("%m-%d %H:%M:%S")


# -- the schedule: pure functions -------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "tz", "now", "due", "next_run"),
    [
        # Due at its own second, not a second before.
        ("*/5 * * * *", "UTC", "05-01 10:05:00", "05-01 10:05:00", "05-01 10:10:00"),
        ("*/5 * * * *", "UTC", "05-01 10:04:59", None, "05-01 10:05:00"),
        # Late by less than the grace: still due (a worker restarted by a deploy).
        ("*/5 * * * *", "UTC", "05-01 10:05:59", "05-01 10:05:00", "05-01 10:10:00"),
        # Late by the grace or more: never enqueued (no backfill).
        ("*/5 * * * *", "UTC", "05-01 10:06:00", None, "05-01 10:10:00"),
        ("0 3 * * *", "UTC", "05-01 09:00:00", None, "05-02 03:00:00"),
        # A time zone: 03:00 in Berlin is 01:00 UTC in summer, 02:00 in winter.
        ("0 3 * * *", "Europe/Berlin", "07-01 01:00:10", "07-01 01:00:00", "07-02 01:00:00"),
        ("0 3 * * *", "Europe/Berlin", "01-15 02:00:00", "01-15 02:00:00", "01-16 02:00:00"),
        # Berlin springs forward 2024-03-31 02:00 CET -> 03:00 CEST (01:00 UTC):
        # 02:30 does not exist that day and runs at the jump, once.
        ("30 2 * * *", "Europe/Berlin", "03-31 01:00:00", "03-31 01:00:00", "04-01 00:30:00"),
        ("30 2 * * *", "Europe/Berlin", "03-31 00:30:00", None, "03-31 01:00:00"),
        # Berlin falls back 2024-10-27 03:00 CEST -> 02:00 CET (01:00 UTC):
        # 02:30 happens twice; a fixed-hour entry runs in the first pass only.
        ("30 2 * * *", "Europe/Berlin", "10-27 00:30:00", "10-27 00:30:00", "10-28 01:30:00"),
        ("30 2 * * *", "Europe/Berlin", "10-27 01:30:00", None, "10-28 01:30:00"),
        # ... while an hourly entry runs in both passes (it is about intervals).
        ("30 * * * *", "Europe/Berlin", "10-27 01:30:00", "10-27 01:30:00", "10-27 02:30:00"),
        # New York: spring forward 2024-03-10 02:00 EST -> 03:00 EDT (07:00 UTC).
        ("30 2 * * *", "America/New_York", "03-10 07:00:00", "03-10 07:00:00", "03-11 06:30:00"),
        # Fall back 2024-11-03 02:00 EDT -> 01:00 EST (06:00 UTC): 01:30 twice.
        ("30 1 * * *", "America/New_York", "11-03 05:30:00", "11-03 05:30:00", "11-04 06:30:00"),
        ("30 1 * * *", "America/New_York", "11-03 06:30:00", None, "11-04 06:30:00"),
        # Seconds, as a sixth field (an extension of croniter's).
        ("* * * * * */10", "UTC", "05-01 10:00:15", "05-01 10:00:10", "05-01 10:00:20"),
        # A nickname.
        ("@hourly", "UTC", "05-01 10:00:30", "05-01 10:00:00", "05-01 11:00:00"),
    ],
)
def test_due_slot_and_next_run(cron, tz, now, due, next_run):
    schedule = Schedule(cron, tz)
    at = ts(now)
    assert short(schedule.due_slot(at, LATE_GRACE_S)) == due
    assert short(schedule.next_run(at)) == next_run


@pytest.mark.parametrize(
    ("cron", "tz", "start", "end", "expected"),
    [
        # Every half hour across Berlin's fall-back: every real half hour,
        # including both passes through 02:00-03:00.
        (
            "*/30 * * * *",
            "Europe/Berlin",
            "10-26 23:50:00",
            "10-27 02:10:00",
            ["00:00", "00:30", "01:00", "01:30", "02:00"],
        ),
        # And across the spring-forward: the missing hour has no slots.
        (
            "*/30 * * * *",
            "Europe/Berlin",
            "03-31 00:10:00",
            "03-31 01:40:00",
            ["00:30", "01:00", "01:30"],
        ),
    ],
)
def test_runs_across_dst_changes(cron, tz, start, end, expected):
    runs = Schedule(cron, tz).runs(ts(start), ts(end))
    assert [iso(at)[11:16] for at in runs] == expected


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York", "Australia/Sydney", "UTC"])
@pytest.mark.parametrize("cron", ["30 2 * * *", "30 1 * * *", "0 0 * * *"])
def test_a_daily_entry_runs_exactly_once_a_day_all_year(cron, tz):
    runs = Schedule(cron, tz).runs(ts("2024-01-01T12:00:00+00:00"), ts("2025-01-01T12:00:00+00:00"))
    days = Counter(datetime.fromtimestamp(at, Schedule(cron, tz).zone).date() for at in runs)
    assert len(runs) == 366  # 2024 is a leap year; no day twice, none missed
    assert set(days.values()) == {1}


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("", "must be a non-empty string"),
        (5, "must be a non-empty string"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("61 * * * *", "is not a valid cron expression"),
        ("a b c d e", "is not a valid cron expression"),
        ("@sometimes", "is not a valid cron expression"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_cron_errors(cron, problem):
    assert problem in (cron_error(cron) or "")
    if isinstance(cron, str):
        with pytest.raises(ValueError, match="cron"):
            Schedule(cron)


@pytest.mark.parametrize("cron", ["*/5 * * * *", "0 3 * * 1-5", "@daily", "* * * * * */2", " 0  3 * * * "])
def test_good_crons(cron):
    assert cron_error(cron) is None


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", None, "Europe"])
def test_bad_time_zones(tz):
    assert tz_error(tz)
    with pytest.raises(ValueError, match="tz"):
        Schedule("* * * * *", tz)


def test_pjid_is_stable_and_names_the_whole_entry():
    a = Entry("*/5 * * * *", RECORD, ("x",), {"k": 1, "j": 2})
    same = Entry(" */5  * * * * ", RECORD, ["x"], {"j": 2, "k": 1})  # type: ignore[arg-type]
    assert a.pjid == same.pjid and len(a.pjid) == 32
    others = [
        Entry("*/6 * * * *", RECORD, ("x",), {"k": 1, "j": 2}),
        Entry("*/5 * * * *", RECORD, ("y",), {"k": 1, "j": 2}),
        Entry("*/5 * * * *", RECORD, ("x",), {"k": 1}),
        Entry("*/5 * * * *", RECORD, ("x",), {"k": 1, "j": 2}, queue="mail"),
        Entry("*/5 * * * *", RECORD, ("x",), {"k": 1, "j": 2}, tz="Europe/Berlin"),
        Entry("*/5 * * * *", SLEEP, ("x",), {"k": 1, "j": 2}),
    ]
    assert len({a.pjid, *(o.pjid for o in others)}) == 7
    # until_executed is not part of the identity: turning it on keeps the slots.
    assert Entry("*/5 * * * *", RECORD, ("x",), {"k": 1, "j": 2}, until_executed=True).pjid == a.pjid


# -- @periodic and the checks ------------------------------------------------------


@pytest.fixture
def decorated(monkeypatch):
    entries: list[Entry] = []
    monkeypatch.setattr(periodic, "_decorated", entries)
    return entries


def test_periodic_decorator_registers_an_entry(cog, decorated):
    @periodic.periodic("0 4 * * *", args=[1], kwargs={"a": "b"}, tz="Europe/Berlin", until_executed=True)
    @periodic.periodic("*/10 * * * *")
    @job(name="tests.periodic.nightly")
    def nightly(*args: Any, **kwargs: Any) -> None:
        pass

    assert nightly.name == "tests.periodic.nightly"  # the job itself comes back
    found = {(e.cron, e.tz, e.args, e.until_executed) for e in periodic.entries()}
    assert found == {("*/10 * * * *", "UTC", (), False), ("0 4 * * *", "Europe/Berlin", (1,), True)}


def test_periodic_decorator_refuses_bad_use(decorated):
    def plain() -> None:
        pass

    with pytest.raises(TypeError, match="put @periodic"):
        periodic.periodic("* * * * *")(plain)  # type: ignore[arg-type]
    made = job(name="tests.periodic.bad")(plain)
    with pytest.raises(ValueError, match="'cron' '61 \\* \\* \\* \\*' is not a valid"):
        periodic.periodic("61 * * * *")(made)
    with pytest.raises(ValueError, match="'tz' 'Nowhere/City'"):
        periodic.periodic("* * * * *", tz="Nowhere/City")(made)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        periodic.periodic("* * * * *", args=[object()])(made)
    assert decorated == []


def test_checks_catch_what_the_ticker_would_refuse(cog):
    cog.configure(
        PERIODIC=[
            {"cron": "0 0 30 2 *", "job": RECORD},
            {"cron": "* * * * * * *", "job": RECORD},
            {"cron": "* * * * *", "job": RECORD, "args": [datetime(2024, 1, 1)]},
            {"cron": "* * * * *", "job": RECORD, "kwargs": {"when": {1, 2}}},
            {"cron": "*/5 * * * *", "job": RECORD, "tz": "Europe/Berlin", "until_executed": True},
            {"cron": "61 * * * *", "job": RECORD},  # E020 (another check), not reported twice
        ]
    )
    found = [(e.id, e.msg) for e in check_settings()]
    prefix = "COGWORKER['PERIODIC']"
    assert found[0][0] == "cogworker.E020" and found[0][1].startswith(f"{prefix}[5]")
    assert found[1:] == [
        (
            "cogworker.E022",
            f"{prefix}[0]: 'cron' '0 0 30 2 *' never fires: no date matches it "
            "(such as the 30th of February).",
        ),
        (
            "cogworker.E022",
            f"{prefix}[1]: 'cron' '* * * * * * *' has 7 fields; use five (minute hour day-of-month month "
            "day-of-week), or six with seconds last.",
        ),
        (
            "cogworker.E023",
            f"{prefix}[2]: positional argument 0 of job '{RECORD}' is not JSON-serialisable "
            "(datetime: Object of type datetime is not JSON serializable); " + PLAIN_JSON,
        ),
        (
            "cogworker.E023",
            f"{prefix}[3]: argument 'when' of job '{RECORD}' is not JSON-serialisable "
            "(set: Object of type set is not JSON serializable); " + PLAIN_JSON,
        ),
    ]


# -- the ticker against a real Redis, with an injected clock ---------------------------


def ticker(*entries: Entry) -> Ticker:
    return Ticker(get_redis(), get_keys(), get_config(), threading.Event(), entries)


def queued(cog: Any, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1)]


def test_each_slot_is_enqueued_once_and_missed_slots_are_not_backfilled(cog):
    entry = Entry("0 * * * *", RECORD, ("hourly",))
    slot = ts("2024-05-01T10:00:00+00:00")
    first, second = ticker(entry), ticker(entry)  # two processes
    assert first.tick(slot + 0.2) == {entry.pjid: PUSHED}
    assert second.tick(slot + 0.3) == {entry.pjid: ALREADY}
    assert first.tick(slot + 5) == {}  # this process handled the slot already
    # A process started after the grace (it was down at 10:00): nothing.
    assert ticker(entry).tick(slot + LATE_GRACE_S) == {}
    # One started within the grace enqueues nothing more either: the marker says it was done.
    assert ticker(entry).tick(slot + LATE_GRACE_S - 1) == {entry.pjid: ALREADY}

    jobs = queued(cog)
    assert len(jobs) == 1
    assert jobs[0]["job"] == RECORD and jobs[0]["args"] == ["hourly"]
    assert jobs[0]["periodic_pjid"] == entry.pjid and jobs[0]["periodic_slot"] == int(slot)
    assert "periodic_until_executed" not in jobs[0]
    marker = cog.key(f"periodic:slot:{entry.pjid}:{int(slot)}")
    assert cog.redis.get(marker).decode() == jobs[0]["jid"]
    assert LATE_GRACE_S < cog.redis.ttl(marker) <= SLOT_MARKER_TTL_S
    assert float(cog.redis.hget(cog.key("periodic:last"), entry.pjid)) == pytest.approx(slot + 0.2)

    # The next slot is a new one.
    assert second.tick(slot + 3600.1) == {entry.pjid: PUSHED}
    assert len(queued(cog)) == 2


def test_an_entry_queue_overrides_the_jobs_queue(cog):
    entry = Entry("* * * * *", RECORD, queue="mail")
    ticker(entry).tick(ts("2024-05-01T10:00:00+00:00"))
    assert [j["queue"] for j in queued(cog, "mail")] == ["mail"]
    assert cog.redis.sismember(cog.key("queues"), "mail")


def test_until_executed_skips_slots_while_a_run_is_queued_then_resumes(cog):
    entry = Entry("* * * * *", RECORD, ("x",), until_executed=True)
    t = ticker(entry)
    lock = cog.key(f"periodic:running:{entry.pjid}")
    s1 = ts("2024-05-01T10:00:00+00:00")
    assert t.tick(s1) == {entry.pjid: PUSHED}
    (first,) = queued(cog)
    assert first["periodic_until_executed"] is True
    assert cog.redis.get(lock).decode() == first["jid"]
    assert PERIODIC_QUEUED_TTL_S - 5 < cog.redis.ttl(lock) <= PERIODIC_QUEUED_TTL_S

    assert t.tick(s1 + 60) == {entry.pjid: SKIPPED}
    assert cog.redis.get(cog.key(f"periodic:slot:{entry.pjid}:{int(s1 + 60)}")) == b"skipped"
    assert ticker(entry).tick(s1 + 61) == {entry.pjid: ALREADY}  # skipped counts as handled
    assert len(queued(cog)) == 1

    assert testing.drain() == 1  # the run ends: the lock goes
    assert cog.redis.exists(lock) == 0
    assert t.tick(s1 + 120) == {entry.pjid: PUSHED}
    (second,) = queued(cog)
    assert cog.redis.get(lock).decode() == second["jid"] != first["jid"]


@pytest.fixture
def logged(caplog):
    # The package logger does not propagate (see the test settings): listen to it directly.
    logger = logging.getLogger("django_cogworker")
    # The handler is pytest's own for every test of the process: its level
    # is put back, or later tests reading caplog would miss their lines.
    level = caplog.handler.level
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.ERROR)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        caplog.handler.setLevel(level)


def test_a_broken_entry_is_logged_once_and_never_stops_the_others(cog, logged):
    caplog = logged
    unknown = Entry("* * * * *", "tests.not.registered")
    bad_queue = Entry("* * * * *", RECORD, queue="broken")
    good = Entry("* * * * *", RECORD, ("good",))
    cog.redis.set(cog.key("queue:broken"), "a string, not a list")
    t = ticker(unknown, bad_queue, good)
    s1 = ts("2024-05-01T10:00:00+00:00")
    assert t.tick(s1) == {good.pjid: PUSHED}
    assert t.tick(s1 + 1) == {}
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 2  # once per entry, not once per tick
    assert "tests.not.registered" in errors[0] and "JobNotRegistered" in errors[0]
    assert "WRONGTYPE" in errors[1]
    # The failed push left no marker: once the key is fixed, the same slot goes out.
    assert not cog.redis.exists(cog.key(f"periodic:slot:{bad_queue.pjid}:{int(s1)}"))
    cog.redis.delete(cog.key("queue:broken"))
    assert t.tick(s1 + 2) == {bad_queue.pjid: PUSHED}
    assert len(queued(cog, "broken")) == 1


def test_ticker_thread_wakes_at_the_slot_and_stops_at_once(cog):
    # A real ticker thread with a per-second entry: it wakes at each slot
    # (not on a fixed period) and returns as soon as it is told to stop.
    entry = Entry("* * * * * *", RECORD, ("thread",))
    t = ticker(entry)
    thread = threading.Thread(target=t.run)
    thread.start()
    try:
        jobs = wait_for(lambda: len(queued(cog)) >= 4 and queued(cog), 10, "four slots")
        jobs.sort(key=lambda j: j["periodic_slot"])
        assert len({j["periodic_slot"] for j in jobs}) == len(jobs)
        # The first is the current slot when the thread started (late, within
        # the grace); the next ones go out at their second.
        lag_s = [j["enqueued_at"] - j["periodic_slot"] for j in jobs[1:]]
        assert all(0 <= lag < 0.5 for lag in lag_s), lag_s
    finally:
        stopped_at = time.monotonic()
        t.stop.set()
        thread.join(5)
    assert not thread.is_alive() and time.monotonic() - stopped_at < 0.5


# -- the running lock around a run ---------------------------------------------------


def periodic_payload(cog: Any, job_name: str, *, jid: str = "run-1") -> bytes:
    made = registry.get(job_name)
    assert made is not None
    payload = made.payload([], {})
    payload.update(jid=jid, periodic_pjid="p1", periodic_until_executed=True)
    return encode(payload)


@pytest.mark.parametrize(
    ("job_name", "kept"),
    [
        (RECORD, False),  # success: released
        ("testproject.testapp.jobs.fail", True),  # a retry: kept
        ("testproject.testapp.jobs.fail_no_retry", False),  # dead: released
        ("testproject.testapp.jobs.fail_and_drop", False),  # dropped: released
    ],
)
def test_the_running_lock_is_released_when_the_run_ends_for_good(cog, job_name, kept):
    lock = cog.key("periodic:running:p1")
    cog.redis.set(lock, "run-1", ex=30)
    execute(periodic_payload(cog, job_name), get_config(), close_connections=False)
    if kept:
        assert cog.redis.get(lock) == b"run-1"
        assert cog.redis.ttl(lock) > PERIODIC_QUEUED_TTL_S - 5  # covers the retry's wait
    else:
        assert not cog.redis.exists(lock)
    assert HELD.snapshot() == []


def test_a_run_extends_its_lock_and_never_touches_another_runs_lock(cog):
    lock = cog.key("periodic:running:p1")
    cog.redis.set(lock, "run-1", ex=5)
    seen: list[tuple[Any, Any]] = []

    @job(name="tests.periodic.peek")
    def peek() -> None:
        seen.append((cog.redis.ttl(lock), HELD.snapshot()))

    execute(periodic_payload(cog, "tests.periodic.peek"), get_config(), close_connections=False)
    (ttl, held) = seen[0]
    assert ttl > ACTIVE_TTL_MIN_S - 5  # active TTL while running
    assert held == [("run-1", "p1")]  # the ticker extends it during a long run

    cog.redis.set(lock, "someone-else", ex=5)
    execute(periodic_payload(cog, "tests.periodic.peek"), get_config(), close_connections=False)
    assert cog.redis.get(lock) == b"someone-else" and cog.redis.ttl(lock) <= 5


def test_held_locks_are_extended(cog):
    lock = cog.key("periodic:running:p9")
    cog.redis.set(lock, "run-9", ex=3)
    HELD.add("run-9", "p9")
    try:
        assert HELD.extend(get_redis(), get_keys(), 500) == 1
        assert 495 < cog.redis.ttl(lock) <= 500
        cog.redis.set(lock, "another-run", ex=3)
        assert HELD.extend(get_redis(), get_keys(), 500) == 0
        assert cog.redis.ttl(lock) <= 3
    finally:
        HELD.remove("run-9")


def test_active_ttl_outlives_the_time_to_recover_a_dead_worker(cog):
    cog.configure(ORPHAN_THRESHOLD=3000, ORPHAN_CHECK_INTERVAL=600, HEARTBEAT_TTL=60)
    assert active_ttl_s(get_config()) > 3000 + 600
    cog.configure(ORPHAN_THRESHOLD=2, ORPHAN_CHECK_INTERVAL=0.5, HEARTBEAT_TTL=1)
    assert active_ttl_s(get_config()) == ACTIVE_TTL_MIN_S


def test_recovery_and_give_back_retake_the_running_lock_for_the_requeued_run(cog):
    # The payload fields the ticker writes are what the requeue scripts read.
    from django_cogworker.fetch import UnitOfWork
    from django_cogworker.manager import Manager
    from django_cogworker.process import open_process
    from django_cogworker.recovery import Recovery

    config = get_config()
    entry = Entry("* * * * *", RECORD, until_executed=True)
    ticker(entry).tick(ts("05-01 10:00:00"))
    (raw,) = cog.redis.lrange(cog.key("queue:default"), 0, -1)
    jid = json.loads(raw)["jid"]
    lock = cog.key(f"periodic:running:{entry.pjid}")

    # A dead process held it, and the lock lapsed meanwhile: recovery re-takes it.
    cog.redis.delete(cog.key("queue:default"), lock)
    cog.redis.rpush(cog.key("inprogress:dead-host:1:x"), raw)
    manager = Manager(open_process(config, "live-host:2:y"), config.queues, 1, "reliable", 1.0)
    recovery = Recovery(manager.process)
    assert recovery.requeue_in_progress("dead-host:1:x", if_dead_for_s=config.orphan_threshold_s) == 1
    assert cog.redis.get(lock).decode() == jid
    assert PERIODIC_QUEUED_TTL_S - 5 < cog.redis.ttl(lock) <= PERIODIC_QUEUED_TTL_S

    # A give-back (fetched at shutdown, not run) does the same; never over another run's lock.
    for held_by, expected in [(None, jid), ("the-next-run", "the-next-run")]:
        requeued = cog.redis.rpop(cog.key("queue:default"))
        cog.redis.rpush(cog.key(f"inprogress:{manager.identity}"), requeued)
        cog.redis.delete(lock)
        if held_by:
            cog.redis.set(lock, held_by, ex=30)
        manager.fetcher().give_back(UnitOfWork("default", requeued))
        assert cog.redis.get(lock).decode() == expected
        assert json.loads(cog.redis.lindex(cog.key("queue:default"), -1))["jid"] == jid


# -- the inspection API ------------------------------------------------------------


def test_periodic_entries_for_the_admin(cog, decorated):
    cog.configure(
        PERIODIC=[
            {"cron": "0 3 * * *", "job": RECORD, "tz": "Europe/Berlin"},
            {"cron": "*/5 * * * *", "job": SLEEP, "args": [1], "queue": "low", "until_executed": True},
            {"cron": "not cron", "job": RECORD},  # broken: left out
        ]
    )
    before = time.time()
    first, second = api.PeriodicEntries()
    assert (first.job, first.cron, first.tz, first.queue, first.until_executed) == (
        RECORD,
        "0 3 * * *",
        "Europe/Berlin",
        "default",
        False,
    )
    assert first.last_run is None and first.running is False
    assert first.next_run.tzinfo is not None and first.next_run.timestamp() > before
    assert first.next_run.astimezone(Schedule("* * * * *", "Europe/Berlin").zone).hour == 3
    assert (second.queue, second.args) == ("low", [1])

    ticker(*periodic.entries()).tick(ts("2024-05-01T10:00:00+00:00"))
    second = api.PeriodicEntries().find(second.pjid)
    assert second is not None and second.running is True
    assert second.last_run == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert len(api.PeriodicEntries()) == 2


# -- real worker processes ---------------------------------------------------------------


def slot_markers(cog: Any, pjid: str) -> dict[int, str]:
    prefix = cog.key(f"periodic:slot:{pjid}:")
    found = {}
    for key in cog.redis.scan_iter(match=prefix + "*", count=1000):
        found[int(key.decode().removeprefix(prefix))] = cog.redis.get(key).decode()
    return found


def test_several_processes_enqueue_each_slot_exactly_once(cog, capsys):
    entry = {"cron": "* * * * * *", "job": RECORD, "args": ["tick"]}
    pjid = parse_setting(entry).pjid
    cog.configure(PERIODIC=[entry], MIDDLEWARE=NOTE_RUNS)
    # Each slot's enqueue is logged at DEBUG.
    workers = [cog.start_worker(env={"COGWORKER_LOG_LEVEL": "DEBUG"}) for _ in range(3)]
    for worker in workers:
        worker.identity()
    # The tickers start right after each process's first beat: count from the next slots.
    start = int(time.time()) + 2
    end = start + 5
    wait_for(
        lambda: max((n["slot"] or 0 for n in cog.notes("middleware")), default=0) >= end + 1, 20, "slots"
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(15) == 0

    notes = cog.notes("middleware")
    runs = Counter(n["slot"] for n in notes if n["hook"] == "before" and start <= n["slot"] <= end)
    by_jid = {n["jid"]: n["slot"] for n in notes}
    pushes: Counter[int] = Counter()  # enqueues per slot, from every process's own log
    pushers: Counter[int] = Counter()  # enqueues per process
    for worker in workers:
        for line in worker.log().splitlines():
            if f"periodic {RECORD} " in line and "enqueued jid=" in line:
                slot = by_jid.get(line.rsplit("jid=", 1)[1].strip())
                if slot is not None and start <= slot <= end:
                    pushes[slot] += 1
                    pushers[worker.pid] += 1
    markers = {slot: jid for slot, jid in slot_markers(cog, pjid).items() if start <= slot <= end}
    with capsys.disabled():
        print(
            f"\n[periodic] 3 processes, {end - start + 1} one-second slots: enqueues per slot "
            f"{dict(sorted(Counter(pushes.values()).items()))}, runs per slot "
            f"{dict(sorted(Counter(runs.values()).items()))}, enqueues by process {sorted(pushers.values())}"
        )
    assert set(runs.values()) == {1}  # no slot ran twice
    assert set(pushes.values()) == {1}  # no slot was pushed twice
    assert len(runs) >= end - start  # at most one slot lost to a stalled machine
    assert all(by_jid.get(jid) == slot for slot, jid in markers.items())  # each marker names its one run


def test_until_executed_run_longer_than_the_period_skips_then_resumes(cog):
    entry = {"cron": "* * * * * *", "job": SLEEP, "args": [2.5], "until_executed": True}
    pjid = parse_setting(entry).pjid
    cog.configure(PERIODIC=[entry], CONCURRENCY=4)
    worker = cog.start_worker()
    wait_for(lambda: len(cog.notes("runs")) >= 2, 30, "two runs to finish")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0

    started = {n["jid"]: n["at"] for n in cog.notes("started")}
    ended = {n["jid"]: n["at"] for n in cog.notes("runs")}
    spans = sorted((started[jid], ended.get(jid, float("inf"))) for jid in started)
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        assert next_start >= end  # never two runs at once, with 4 free threads
    markers = sorted(slot_markers(cog, pjid).items())
    kinds = "".join("s" if jid == "skipped" else "P" for _, jid in markers)
    # Slots one second apart: pushed, then skipped while the 2.5 s run lasts
    # (at least the two slots it fully covers), then pushed again.
    pushed = kinds.split("P")
    assert kinds.startswith("P") and len(pushed) >= 3, kinds
    assert all(len(gap) >= 2 for gap in pushed[1:-1]), kinds


def test_a_recovered_periodic_job_keeps_its_lock_so_no_parallel_run_starts(cog):
    # block_first_run sleeps 60 s on a jid's first run and is quick on a re-run.
    entry = {"cron": "* * * * * *", "job": BLOCK, "args": [60], "until_executed": True}
    pjid = parse_setting(entry).pjid
    lock = cog.key(f"periodic:running:{pjid}")
    cog.configure(PERIODIC=[entry])
    victim = cog.start_worker()
    first = wait_for(lambda: cog.notes("started"), 20, "the first run to start")[0]
    jid = first["jid"]
    assert first["pid"] == victim.pid and cog.redis.get(lock).decode() == jid
    rescuer = cog.start_worker()
    rescuer.identity()

    victim.signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.time()
    # Until recovery (ORPHAN_THRESHOLD 2 s) the dead run keeps the lock: slots are skipped.
    time.sleep(1.2)
    assert cog.redis.get(lock).decode() == jid
    rerun = wait_for(lambda: [n for n in cog.notes("runs") if n["jid"] == jid], 30, "the recovered run")[0]
    assert rerun["pid"] == rescuer.pid
    # Resumed afterwards: a new slot starts, only after the recovered run ended.
    nxt = wait_for(lambda: [n for n in cog.notes("started") if n["jid"] != jid], 20, "the next slot")[0]
    assert nxt["at"] >= rerun["at"]
    assert [n["jid"] for n in cog.notes("runs")] == [jid]  # no other run finished beside it
    skipped = [
        s for s, v in slot_markers(cog, pjid).items() if v == "skipped" and killed_at <= s <= rerun["at"]
    ]
    assert skipped, "slots between the kill and the recovered run were skipped"
