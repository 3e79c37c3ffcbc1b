"""G20, the supervisor of ``--processes N``, with real processes and real
signals on a real Redis.

Children are found in two ways: their process records in Redis (``pid``
field of ``N:process:<identity>``) once they have beaten, and the
supervisor's children in ``/proc`` (sampled in a thread, so that a child
spawned and stopped within a second is seen too). A child is dead once its
``/proc`` entry is gone or a zombie: a child re-parented to pid 1 may never
be reaped here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from django_cogworker.supervisor import KILL_MARGIN_S, SUPERVISOR_FD_ENV, SUPERVISOR_PID_ENV
from testproject.testapp import jobs
from tests.conftest import FAST, MANAGE, ROOT, CogEnv, Worker, cpu_seconds, wait_for
from tests.test_guarantees import assert_deregistered, keys, leftovers

SHUTDOWN_TIMEOUT_S = float(FAST["SHUTDOWN_TIMEOUT"])
HEARTBEAT_TTL_S = float(FAST["HEARTBEAT_TTL"])
#: How long a clean stop of a supervisor may take beyond SHUTDOWN_TIMEOUT
#: (a child's last round trips and exit); well below KILL_MARGIN_S, so a
#: stop that needed the SIGKILL backstop does not pass for a clean one.
STOP_MARGIN_S = 4.0
#: How long children may take to notice a SIGKILLed supervisor and stop:
#: HEARTBEAT_TTL-ish bounds of the FAST settings.
ORPHANED_STOP_S = 15.0


# -- processes, as /proc and Redis see them -------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def children_of(pid: int) -> set[int]:
    """The live worker children of ``pid``: not the ``file`` command that
    ``platform.architecture()`` runs while croniter is imported, nor a fork
    of ``pid`` that runs no worker of its own (the system checks' child,
    which keeps ``pid``'s command line; so does a worker child for the
    instant before it execs)."""
    found = set()
    parent = cmdline(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] not in ("Z", "X"):
                line = cmdline(int(entry))
                if b"cogworker" in line and line != parent:
                    found.add(int(entry))
    return found


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def registered(cog: CogEnv) -> dict[str, int]:
    """identity -> pid of every process whose record is in Redis (the
    shared record under SHARDING, not a group's presence key)."""
    k, out = keys().shared, {}
    for ident in cog.redis.smembers(k.processes):
        pid = cog.redis.hget(k.process(ident.decode()), "pid")
        if pid is not None:
            out[ident.decode()] = int(pid)
    return out


def wait_for_children(cog: CogEnv, supervisor: Worker, n: int, timeout: float = 30) -> dict[str, int]:
    """The identities and pids of the supervisor's ``n`` children, once all
    of them have beaten."""

    def ready() -> dict[str, int] | None:
        mine = {i: p for i, p in registered(cog).items() if p in children_of(supervisor.pid)}
        return mine if len(mine) == n else None

    # Children booting on a busy machine add to the supervisor's CPU time.
    booting = partial(cpu_seconds, supervisor.pid)
    return dict(wait_for(ready, timeout, f"{n} children of the supervisor to beat", progress=booting))


@contextmanager
def watching_children(pid: int) -> Iterator[set[int]]:
    """Every child ``pid`` has while the block runs, sampled every 10 ms."""
    seen: set[int] = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.update(children_of(pid))
            done.wait(0.01)

    thread = threading.Thread(target=sample, name="test-children-sampler", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(5)


def wait_all_dead(pids: set[int], timeout: float, what: str) -> None:
    wait_for(lambda: not any(alive(p) for p in pids), timeout, what)


def suspend(pid: int) -> None:
    """SIGSTOPs ``pid`` until it stays stopped: the supervisor sends SIGCONT
    right after its SIGTERM, and a SIGCONT that arrives after the test's
    SIGSTOP resumes the child."""

    def stopped() -> bool:
        stat = proc_stat(pid)
        return stat is not None and stat[0] == "T"

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        if stopped():
            time.sleep(0.3)
            if stopped():
                return
    raise AssertionError(f"pid {pid} did not stay stopped")


def lines_of(worker: Worker, pid: int) -> list[str]:
    return [line for line in worker.log().splitlines() if f"[{pid}]" in line]


# -- G20 ---------------------------------------------------------------------------------------


def test_g20_sigterm_just_after_a_child_died_stops_every_child_and_exits_0(cog):
    for delay_s in (0.05, 0.3, 0.9, 1.05, 1.5):
        supervisor = cog.start_worker("--processes", "2")
        with watching_children(supervisor.pid) as seen:
            first = wait_for_children(cog, supervisor, 2)
            victim_identity, victim = min(first.items(), key=lambda item: item[1])
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            time.sleep(delay_s)
            supervisor.signal(signal.SIGTERM)
            began = time.monotonic()
            try:
                code = supervisor.wait(SHUTDOWN_TIMEOUT_S + STOP_MARGIN_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"SIGTERM {delay_s}s after a child died: the supervisor did not exit within "
                    f"{SHUTDOWN_TIMEOUT_S + STOP_MARGIN_S}s; children alive: "
                    f"{sorted(p for p in seen if alive(p))}"
                ) from None
            took_s = time.monotonic() - began
        assert code == 0, f"SIGTERM {delay_s}s after a child died: exit status {code}"
        assert set(first.values()) <= seen
        # Every child it ever had, the one spawned in the race included, is gone.
        wait_all_dead(seen, 2, "every child to be gone once the supervisor exited")
        # Every child stopped by the SIGTERM deregistered; the killed one's
        # record is left to expire, HEARTBEAT_TTL after its last beat.
        assert set(registered(cog)) <= {victim_identity}
        expiry_s = HEARTBEAT_TTL_S + 2 - (time.monotonic() - killed_at)
        wait_for(lambda: registered(cog) == {}, max(0.0, expiry_s), "the killed child's record to expire")
        log = supervisor.log()
        assert "still running" not in log, "the stop needed the SIGKILL backstop"
        # Only the child we killed is reported as a crash: no noise for a clean stop.
        crashes = re.findall(r"worker \d+ \(pid (\d+)\) (?:exited with|was killed by)", log)
        assert {int(p) for p in crashes} <= {victim}, log
        print(
            f"\n[g20] SIGTERM {delay_s}s after a child died: exit 0 in {took_s:.1f}s, children {sorted(seen)}"
        )


def test_g20_a_child_that_dies_is_replaced(cog):
    supervisor = cog.start_worker("--processes", "2")
    with watching_children(supervisor.pid) as seen:
        first = wait_for_children(cog, supervisor, 2)
        victim_identity, victim = min(first.items(), key=lambda item: item[1])
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not alive(victim), 5, "the killed child to die")
        second = wait_for(
            lambda: (lambda c: c if len(c) == 2 and victim not in c.values() else None)(
                {i: p for i, p in registered(cog).items() if p in children_of(supervisor.pid)}
            ),
            30,
            "a replacement child to beat",
        )
        [replacement] = set(second.values()) - set(first.values())
        assert proc_stat(replacement) is not None and proc_stat(replacement)[1] == supervisor.pid
        # The replacement works: the jobs of the pair run on both processes.
        jids = jobs.sleep_then_record.delay_many([((0.3, i), {}) for i in range(16)])
        wait_for(lambda: {n["jid"] for n in cog.notes()} >= set(jids), 20, "the jobs to run")
        assert {n["pid"] for n in cog.notes()} == set(second.values())
        # Only the dead child was reported, and replaced once.
        log = supervisor.log()
        assert log.count("restarting it in") == 1
        assert f"(pid {victim}) was killed by SIGKILL; restarting it in" in log
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(SHUTDOWN_TIMEOUT_S + STOP_MARGIN_S) == 0
    assert seen == {*first.values(), replacement}
    wait_all_dead(seen, 2, "every child to be gone")
    # The killed child's registration is left to orphan recovery; the live ones deregistered.
    assert set(registered(cog)) <= {victim_identity}
    for identity in set(first) | set(second):
        if identity != victim_identity:
            assert_deregistered(cog, identity)


def test_g20_tstp_and_ttin_reach_every_child_and_a_quiet_supervisor_restarts_none(cog):
    supervisor = cog.start_worker("--processes", "2")
    children = wait_for_children(cog, supervisor, 2)
    k = keys()
    supervisor.signal(signal.SIGTTIN)
    for pid in children.values():
        wait_for(
            lambda pid=pid: any("thread MainThread" in line for line in lines_of(supervisor, pid)),
            10,
            f"child {pid} to dump its threads",
        )
    supervisor.signal(signal.SIGTSTP)
    for identity in children:
        wait_for(lambda i=identity: cog.redis.hget(k.process(i), "quiet") == b"1", 10, f"{identity} quiet")
    # A replacement would fetch again: a quiet supervisor does not restart a child.
    victim = min(children.values())
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "not restarting it: quiet" in supervisor.log(), 5, "the supervisor to see the death")
    time.sleep(1.5)  # longer than RESTART_PAUSE_S
    assert children_of(supervisor.pid) == set(children.values()) - {victim}
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(SHUTDOWN_TIMEOUT_S + STOP_MARGIN_S) == 0
    wait_all_dead(set(children.values()), 2, "every child to be gone")


def test_g20_children_stop_when_the_supervisor_is_sigkilled_and_their_jobs_are_settled(cog):
    cog.configure(CONCURRENCY=2)
    supervisor = cog.start_worker("--processes", "2")
    children = wait_for_children(cog, supervisor, 2)
    # Each child holds two running jobs and more wait in the queue.
    jids = jobs.sleep_then_record.delay_many([((1.5, i), {}) for i in range(10)])
    wait_for(
        lambda: {n["pid"] for n in cog.notes("started")} == set(children.values()),
        15,
        "both children to run jobs",
    )
    supervisor.signal(signal.SIGKILL)
    supervisor.wait(5)
    killed_at = time.monotonic()
    wait_all_dead(set(children.values()), ORPHANED_STOP_S, "the children to stop without their supervisor")
    stopped_s = time.monotonic() - killed_at
    log = supervisor.log()  # the children write to the supervisor's stdout
    for pid in children.values():
        lines = lines_of(supervisor, pid)
        assert any(f"supervisor (pid {supervisor.pid}) is gone; stopping" in line for line in lines), log
        assert any(line.endswith(" stopped") for line in lines), f"child {pid} did not stop cleanly: {lines}"
    # They stopped gracefully: deregistered, their running jobs finished
    # and the others put back, nothing left in progress or unsettled.
    for identity in children:
        assert_deregistered(cog, identity)
    assert set(leftovers(cog)) <= {keys().queue("default")}
    ran_before = Counter(n["jid"] for n in cog.notes())
    assert ran_before, "no job ran to an end before the children stopped"
    # A new worker runs what was put back; every job ran exactly once (none was orphaned).
    cog.start_worker()
    wait_for(lambda: {n["jid"] for n in cog.notes()} >= set(jids), 20, "every job to run")
    wait_for(lambda: leftovers(cog) == {}, 10, "nothing to be left")
    ran = Counter(n["jid"] for n in cog.notes())
    assert ran == Counter(jids), ran
    print(
        f"\n[g20] supervisor SIGKILLed: 2 children stopped in {stopped_s:.1f}s, "
        f"{len(ran_before)} jobs finished by them, {len(jids) - len(ran_before)} put back, 0 second runs"
    )


def start_child_with_a_pipe(cog: CogEnv, read_fd: int) -> Worker:
    """A plain worker started as the supervisor starts a child: with the
    read end of a pipe whose write end the test holds, and no pdeathsig."""
    log_path = cog.tmp / f"worker-{len(cog.workers)}.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "COGWORKER_REDIS_URL": cog.url,
        "COGWORKER_OVERRIDES": json.dumps(cog.overrides),
        "COGWORKER_LOG_LEVEL": "INFO",
        "PYTHONPATH": str(ROOT),
        SUPERVISOR_FD_ENV: str(read_fd),
        SUPERVISOR_PID_ENV: str(os.getpid()),
    }
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "cogworker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
            pass_fds=(read_fd,),
        )
    worker = Worker(proc, log_path, cog)
    cog.workers.append(worker)
    return worker


def test_g20_the_pipe_alone_stops_a_child_gracefully(cog):
    """No signal at all: the write end closing is enough (pdeathsig aside)."""
    read_fd, write_fd = os.pipe()
    try:
        child = start_child_with_a_pipe(cog, read_fd)
    finally:
        os.close(read_fd)
    identity = child.identity()
    jids = jobs.sleep_then_record.delay_many([((1.0, i), {}) for i in range(6)])
    wait_for(lambda: len(cog.notes("started")) >= 2, 10, "jobs to start")
    os.close(write_fd)  # as the kernel does when the supervisor dies
    assert child.wait(ORPHANED_STOP_S) == 0
    log = child.log()
    assert f"supervisor (pid {os.getpid()}) is gone; stopping" in log
    assert "stopping (waiting up to" in log and log.rstrip().endswith("stopped")
    assert_deregistered(cog, identity)
    assert set(leftovers(cog)) <= {keys().queue("default")}
    cog.start_worker()
    wait_for(lambda: {n["jid"] for n in cog.notes()} >= set(jids), 20, "every job to run")
    assert Counter(n["jid"] for n in cog.notes()) == Counter(jids)


def test_g20_a_child_that_does_not_stop_is_sigkilled_and_its_job_recovered(cog):
    # The child is to be suspended while it waits for its job: a window of
    # SHUTDOWN_TIMEOUT after its stop began, wide enough for a loaded machine.
    shutdown_timeout_s = 8.0
    supervisor = cog.start_worker("--processes", "2", SHUTDOWN_TIMEOUT=shutdown_timeout_s)
    wait_for_children(cog, supervisor, 2)
    jid = jobs.block_first_run.delay(60.0, "stuck")
    [started] = wait_for(lambda: cog.notes("started"), 15, "the job to start")
    stuck = started["pid"]
    supervisor.signal(signal.SIGTERM)
    began = time.monotonic()
    wait_for(
        lambda: any("stopping (waiting up to" in line for line in lines_of(supervisor, stuck)),
        5,
        "the child to begin its stop",
    )
    # Suspended mid-stop, it never exits by itself.
    suspend(stuck)
    bound_s = shutdown_timeout_s + KILL_MARGIN_S
    assert supervisor.wait(bound_s + STOP_MARGIN_S) == 0
    took_s = time.monotonic() - began
    assert took_s >= bound_s - 0.5, f"killed after {took_s:.1f}s, before SHUTDOWN_TIMEOUT + KILL_MARGIN_S"
    assert not alive(stuck)
    assert re.search(rf"\(pid {stuck}\) still running \d+s after SIGTERM; killing it", supervisor.log())
    # Orphan recovery by a new worker returns the job it held.
    cog.start_worker()
    wait_for(lambda: any(n["jid"] == jid for n in cog.notes()), 20, "the job to be recovered and run")
    wait_for(lambda: leftovers(cog) == {}, 10, "nothing to be left")
    print(f"\n[g20] a child suspended mid-stop was SIGKILLed {took_s:.1f}s after SIGTERM; its job ran again")
