"""``CPU_AFFINITY`` (G21): by default a worker leaves the CPUs, the
scheduling policy and the niceness of its processes, its threads and what
its jobs start as the OS gave them; pinned only when the setting asks. Read
back from ``/proc`` of real worker processes (and of the children of a real
``--processes`` supervisor), and from inside real jobs and the thread pools
and subprocesses they start, with jobs running through a real Redis."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import pytest

from django_cogworker import affinity
from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for
from tests.test_supervisor import children_of, registered

USABLE = affinity.usable()

several_cpus = pytest.mark.skipif(
    len(USABLE) < 2, reason="the test process may use one CPU only: nothing to choose between"
)

#: What pinning says at start; nothing about CPUs is said unless it was asked for.
PINNED_LINE = "cogworker keeps its threads on CPU {cpu} under SCHED_BATCH, as CPU_AFFINITY asks"


def allowed_cpus(pid: int) -> dict[int, set[int]]:
    """Thread id -> the CPUs it may run on, for every thread of ``pid``."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            found[int(tid)] = os.sched_getaffinity(int(tid))
    return found


def policies_of(pid: int) -> set[int]:
    """The distinct scheduling policies of the threads of ``pid``."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            found.add(os.sched_getscheduler(int(tid)))
    return found


def niceness_of(pid: int) -> set[int]:
    """The distinct niceness values of the threads of ``pid`` (field 19 of their stat)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = f"/proc/{pid}/task/{tid}/stat"
        with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(stat) as fh:  # ended meanwhile
            found.add(int(fh.read().rpartition(")")[2].split()[16]))
    return found


def cpus_of(pid: int) -> set[frozenset[int]]:
    """The distinct CPU sets of the threads of ``pid``."""
    return {frozenset(cpus) for cpus in allowed_cpus(pid).values()}


def runs_a_job(cog, pid: int) -> None:
    jobs.record.delay(tag="on-its-cpu")
    wait_for(lambda: any(n["tag"] == "on-its-cpu" and n["pid"] == pid for n in cog.notes()), 20, "the job")


def scheduling_in(cog: CogEnv, pids: set[int]) -> dict[int, dict[str, Any]]:
    """Runs ``jobs.scheduling`` until one has run in each process of
    ``pids``; its note (job, pooled thread, subprocess) by pid."""

    def by_pid() -> dict[int, dict[str, Any]]:
        return {n["pid"]: n for n in cog.notes() if n["tag"] == "scheduling"}

    def one_in_each() -> bool:
        if set(by_pid()) >= pids:
            return True
        if not cog.redis.llen(cog.key("queue:default")):
            jobs.scheduling.delay(tag="scheduling")  # all taken: another, for a process that has none yet
        return False

    wait_for(one_in_each, 60, f"a scheduling job in each of {sorted(pids)}")
    found = by_pid()
    assert set(found) == pids
    return found


def assert_as_the_os_gave(cog: CogEnv, pids: set[int], parent: dict[str, Any]) -> None:
    """Every thread of each process, and a job's own thread, pooled thread
    and subprocess in each, have ``parent``'s CPUs, policy and niceness."""
    for pid, note in scheduling_in(cog, pids).items():
        for where in ("job", "pooled", "subprocess"):
            assert note[where] == parent, (pid, where, note[where], parent)
        assert cpus_of(pid) == {frozenset(parent["cpus"])}
        assert policies_of(pid) == {parent["policy"]}
        assert niceness_of(pid) == {parent["nice"]}


def test_g21_by_default_jobs_and_what_they_start_get_the_cpus_policy_and_niceness_the_os_gave(cog):
    """The worker was given this test process's CPUs, policy and niceness:
    its threads, a job, the job's thread pool and its subprocess keep them."""
    parent = jobs.scheduling_now()
    worker = cog.start_worker("--concurrency", "4")
    worker.identity()
    assert_as_the_os_gave(cog, {worker.pid}, parent)
    assert not re.search(r"\bCPU", worker.log()), worker.log()  # the start line says nothing of CPUs


def test_g21_by_default_the_children_of_processes_2_keep_what_the_os_gave(cog):
    parent = jobs.scheduling_now()
    supervisor = cog.start_worker("--processes", "2", "--concurrency", "2")
    wait_for(lambda: len(registered(cog)) == 2, 30, "both children to beat")
    children = children_of(supervisor.pid)
    assert set(registered(cog).values()) == children
    assert_as_the_os_gave(cog, children, parent)
    assert cpus_of(supervisor.pid) == {frozenset(parent["cpus"])}
    assert not re.search(r"\bCPU", supervisor.log()), supervisor.log()


@several_cpus
def test_g21_auto_set_explicitly_still_pins_the_worker_and_what_its_jobs_start(cog):
    """What pinning costs a job that uses more than one core: its thread
    pool and its subprocesses get the worker's one CPU too."""
    parent = jobs.scheduling_now()
    worker = cog.start_worker("--concurrency", "4", CPU_AFFINITY="auto")
    worker.identity()
    ((cpu,),) = cpus_of(worker.pid)
    note = scheduling_in(cog, {worker.pid})[worker.pid]
    for where in ("job", "pooled", "subprocess"):
        assert note[where] == {"cpus": [cpu], "policy": os.SCHED_BATCH, "nice": parent["nice"]}, where
    assert PINNED_LINE.format(cpu=cpu) in worker.log()


@several_cpus
def test_auto_keeps_every_thread_of_a_worker_on_one_cpu(cog):
    worker = cog.start_worker("--concurrency", "4", CPU_AFFINITY="auto")
    worker.identity()
    runs_a_job(cog, worker.pid)
    (only,) = cpus_of(worker.pid)  # the processor threads, heartbeat, poller... alike
    assert len(only) == 1 and only <= set(USABLE)
    assert len(allowed_cpus(worker.pid)) >= 4 + 1
    # On one CPU, a woken thread waits for the waker to block (affinity.py).
    assert policies_of(worker.pid) == {os.SCHED_BATCH}
    (cpu,) = only
    assert PINNED_LINE.format(cpu=cpu) in worker.log()


def test_none_leaves_the_threads_to_the_os(cog):
    worker = cog.start_worker(CPU_AFFINITY=None)
    worker.identity()
    runs_a_job(cog, worker.pid)
    assert cpus_of(worker.pid) == {frozenset(USABLE)}
    assert policies_of(worker.pid) == {os.SCHED_OTHER}
    assert "CPU" not in worker.log()


def test_a_listed_cpu_is_the_one_used(cog):
    cpu = USABLE[-1]
    worker = cog.start_worker(CPU_AFFINITY=[cpu])
    worker.identity()
    runs_a_job(cog, worker.pid)
    assert cpus_of(worker.pid) == {frozenset({cpu})}


def test_a_cpu_that_cannot_be_used_is_logged_and_the_worker_runs_on_any(cog):
    worker = cog.start_worker(CPU_AFFINITY=[4095])
    worker.identity()
    runs_a_job(cog, worker.pid)
    assert cpus_of(worker.pid) == {frozenset(USABLE)}
    assert policies_of(worker.pid) == {os.SCHED_OTHER}
    assert re.search(
        r"WARNING .*cogworker could not keep its threads on CPU 4095 \(.+\); they run on any CPU",
        worker.log(),
    )


@several_cpus
def test_processes_each_get_a_cpu_of_their_own(cog):
    supervisor = cog.start_worker("--processes", "2", "--concurrency", "2", CPU_AFFINITY="auto")
    wait_for(lambda: len(registered(cog)) == 2, 30, "both children to beat")
    children = children_of(supervisor.pid)
    assert set(registered(cog).values()) == children
    sets = [cpus_of(pid) for pid in sorted(children)]
    assert all(len(s) == 1 and len(next(iter(s))) == 1 for s in sets), sets
    assert sets[0] != sets[1], "two children on the same CPU"
    # The supervisor itself, which runs no job, is left to the OS.
    assert cpus_of(supervisor.pid) == {frozenset(USABLE)}


def test_processes_take_the_listed_cpus_in_turn(cog):
    cpu = USABLE[0]
    supervisor = cog.start_worker("--processes", "2", "--concurrency", "2", CPU_AFFINITY=[cpu])
    wait_for(lambda: len(registered(cog)) == 2, 30, "both children to beat")
    for pid in children_of(supervisor.pid):
        assert cpus_of(pid) == {frozenset({cpu})}
        assert policies_of(pid) == {os.SCHED_BATCH}
    assert policies_of(supervisor.pid) == {os.SCHED_OTHER}


# -- the plan, without processes ------------------------------------------------------------


def test_plan_for_none_and_for_a_list():
    assert affinity.plan(None, 3) == [None, None, None]
    assert affinity.plan([3, 1], 3) == [3, 1, 3]
    assert affinity.plan((2,), 1) == [2]


def test_plan_auto_gives_consecutive_cpus_from_the_least_busy(monkeypatch):
    monkeypatch.setattr(affinity, "usable", lambda: [0, 2, 5])
    monkeypatch.setattr(affinity, "spread", lambda cpus: cpus)
    monkeypatch.setattr(affinity, "least_busy", lambda cpus: 2)
    assert affinity.plan(affinity.AUTO, 4) == [2, 5, 0, 2]


def test_spread_puts_one_thread_of_every_core_first(monkeypatch):
    # Four cores with two threads each, numbered as on many Intel machines:
    # CPU n and CPU n + 4 share a core.
    monkeypatch.setattr(affinity, "_topology", lambda cpu, name: "0" if name != "core_id" else str(cpu % 4))
    assert affinity.spread([0, 1, 2, 3, 4, 5, 6, 7]) == [0, 1, 2, 3, 4, 5, 6, 7]
    # Numbered as on many AMD machines and VMs: CPU 2k and 2k + 1 share a core.
    monkeypatch.setattr(affinity, "_topology", lambda cpu, name: "0" if name != "core_id" else str(cpu // 2))
    assert affinity.spread([0, 1, 2, 3, 4, 5, 6, 7]) == [0, 2, 4, 6, 1, 3, 5, 7]


def test_spread_reads_this_machines_topology():
    assert sorted(affinity.spread(USABLE)) == USABLE


def test_plan_auto_pins_nothing_when_the_process_may_use_one_cpu(monkeypatch):
    monkeypatch.setattr(affinity, "usable", lambda: [1])
    assert affinity.plan(affinity.AUTO, 2) == [None, None]


def test_least_busy_is_one_of_the_usable_cpus():
    assert affinity.least_busy(USABLE) in USABLE
    assert affinity.least_busy([USABLE[0]]) == USABLE[0]


def test_least_busy_avoids_a_busy_cpu(monkeypatch):
    # Ticks (all, idle) of CPUs 0 and 1: 0 busy all the sample, 1 idle.
    samples = iter([{0: (100, 0), 1: (100, 50)}, {0: (200, 0), 1: (200, 150)}])
    monkeypatch.setattr(affinity, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(affinity, "SAMPLE_S", 0.0)
    assert affinity.least_busy([0, 1]) == 1


def test_cpu_times_reads_every_cpu_of_proc_stat():
    times = affinity._cpu_times()
    assert set(USABLE) <= set(times)
    assert all(total >= idle >= 0 for total, idle in times.values())
