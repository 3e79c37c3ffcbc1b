"""The workflow tests (SPEC section 13, G22) on the sharded layout
(section 16), on a real Redis Cluster of three masters, each with a
replica: the batch, chain and chord tests of ``tests/test_batches*.py``,
``tests/test_chains*.py`` and ``tests/test_nested_batches_chaos.py``, two
of their SIGKILL chaos tests among them (``LEFT_OUT`` says which are not),
run again with ``SHARDING = "queues"``,
every test queue in one group (``{N:all}``). The batches' keys are in the
shared ``{N}`` slot, another slot than their members', often on another
master: every end reaches its batch through the group's outbox, every job
a batch starts reaches the group through ``{N}:forward``. Batches over
several groups are in ``tests/test_sharded_workflows.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from django_cogworker.connection import get_keys
from tests.conftest import CogEnv
from tests.test_sharded_guarantees import GROUP, SHARED, one_group
from tests.topology import ClusterGroup, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

#: The queues the tests use, in one group.
QUEUES = ["default", "mail", "low"]

#: The workflow test modules, by name.
MODULES = {
    name: importlib.import_module(f"tests.{name}")
    for name in (
        "test_batches",
        "test_batches_admin",
        "test_batches_chaos",
        "test_batches_ends",
        "test_batches_faults",
        "test_chains",
        "test_chains_chaos",
        "test_nested_batches_chaos",
    )
}

#: Those whose tests take their keys from a ``keys()`` of their own.
KEYED = ("test_batches_chaos", "test_batches_faults", "test_nested_batches_chaos", "test_batches_ends")

#: Left out: two that observe the one-slot layout itself (the commands one
#: server's MONITOR sees, a plain job's path being the same on both
#: layouts; the testing helpers' drain(), which serves the one-slot
#: layout); and, for CI's time, the chaos tests whose faults the ones kept
#: here (a SIGKILL chaos with retries and deaths, one of child batches)
#: and the chaos over three masters of tests/test_sharded_workflows.py
#: (batches and chains) already bring to the sharded layout's two steps.
LEFT_OUT = {
    "test_a_plain_jobs_worker_path_sends_no_workflow_call",
    "test_drain_runs_batches_and_chains_as_a_worker_does",
    "test_g22_sigkill_chaos_each_callback_enqueued_once_after_its_condition_nothing_lost",
    "test_g22_members_added_from_running_members_under_sigkill_chaos_the_batch_waits_for_them",
    "test_g22_g18_sigstop_chaos_the_late_acks_of_continued_workers_change_nothing",
    "test_g22_chains_and_chords_under_chaos_each_step_and_body_enqueued_once",
}

for _module in MODULES.values():
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test) and _name not in LEFT_OUT:
            globals()[_name] = _test


@pytest.fixture(autouse=True)
def sharded_layout(
    cog: CogEnv,
    monkeypatch: pytest.MonkeyPatch,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> Iterator[None]:
    shared = (*SHARED, "batch", "forward")
    with one_group(cog, monkeypatch, redis_cluster, QUEUES, lambda s: s.startswith(shared)):
        group = get_keys().group(GROUP)
        for name in KEYED:
            monkeypatch.setattr(MODULES[name], "keys", lambda: group)
        monkeypatch.setattr(MODULES["test_chains"], "flow_keys", lambda: group)
        yield
