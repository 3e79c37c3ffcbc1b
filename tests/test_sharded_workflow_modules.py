"""The workflow tests (SPEC section 13, G22) on the sharded layout
(section 16), on a real Redis Cluster of three masters, each with a
replica: the batch, chain and chord tests of ``tests/test_batches.py``,
``tests/test_batches_admin.py``, ``tests/test_batches_ends.py``,
``tests/test_batches_faults.py`` and ``tests/test_chains.py`` (not their
chaos modules: ``LEFT_OUT`` says why), run again with ``SHARDING = "queues"``,
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
        "test_batches_ends",
        "test_batches_faults",
        "test_chains",
    )
}

#: Those whose tests take their keys from a ``keys()`` of their own.
KEYED = ("test_batches_faults", "test_batches_ends")

#: Left out: two that observe the one-slot layout itself (the commands one
#: server's MONITOR sees, a plain job's path being the same on both
#: layouts; the testing helpers' drain(), which serves the one-slot
#: layout); and, for CI's time, the chaos tests (those of the modules not
#: run here, and one of test_batches_faults.py): the SIGKILL chaos over
#: three masters of tests/test_sharded_workflows.py (batches with deaths,
#: chains) brings their faults to the sharded layout's two steps, and the
#: tests kept here each of its paths (deaths, retries, child batches, late
#: acks, the admin's moves).
LEFT_OUT = {
    "test_a_plain_jobs_worker_path_sends_no_workflow_call",
    "test_drain_runs_batches_and_chains_as_a_worker_does",
    "test_g22_g18_sigstop_chaos_the_late_acks_of_continued_workers_change_nothing",
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
