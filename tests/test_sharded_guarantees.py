"""The guarantee tests on the sharded layout (SPEC section 16), on a real
Redis Cluster of three masters, each with a replica.

The tests of ``tests/test_guarantees.py`` that ``tests/test_cluster.py``
collects on the one-slot layout (those that need no server of their own)
and its G14 tests of a worker,
the G18 tests of ``tests/test_revival.py``, the G19 tests of
``tests/test_bounds.py`` that run a worker and three G20 tests of
``tests/test_supervisor.py`` (its supervisor's children), and the SIGKILL and
SIGSTOP chaos tests of ``tests/test_chaos.py``, run again here with
``SHARDING = "queues"``, every test queue in one group (``{N:all}``): the
group's keys (queues, in-progress lists, sets, the beats its master judges
a death by) in one slot, and the shared ones (registry, process records,
stats, paused queues) under ``{N}``, in another slot, often on another
master. The tests' own reads and writes go to the group's keys through the
same helpers (``keys()``, ``cog.key()``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from django_cogworker.connection import get_keys
from tests import test_bounds, test_chaos, test_revival, test_supervisor
from tests import test_guarantees as guarantees
from tests.conftest import CogEnv, delete_sharded
from tests.test_bounds import (  # noqa: F401
    test_g19_a_finished_jobs_ack_goes_with_the_next_call_not_a_job_later,
    test_g19_a_recovered_job_that_finished_is_not_counted_again_when_its_process_dies,
    test_g19_a_sigkill_orphans_at_most_concurrency_jobs,
    test_g19_an_in_progress_list_never_holds_more_than_concurrency_unfinished_jobs,
)
from tests.test_chaos import (  # noqa: F401
    test_chaos_sigkill_a_random_worker_every_second,
    test_chaos_sigstop_a_random_worker_past_the_threshold,
)
from tests.test_guarantees import (  # noqa: F401
    test_g1_jobs_of_a_sigkilled_worker_all_run_and_each_job_is_always_in_one_place,
    test_g2_live_but_silent_owner_keeps_its_jobs,
    test_g2_owner_silent_past_the_threshold_loses_its_job_to_another_worker,
    test_g2_requeue_script_decides_on_presence_and_last_beat_atomically,
    test_g3_a_job_that_kills_its_process_ends_in_dead_after_max_orphanings_plus_one_runs,
    test_g3_finishing_a_job_clears_its_orphan_counter,
    test_g4_recovered_jobs_run_oldest_first_before_jobs_already_queued,
    test_g5_a_job_whose_queue_key_is_broken_rotates_and_does_not_block_the_others,
    test_g6_a_failed_job_whose_filing_failed_is_filed_later,
    test_g6_a_finished_job_whose_ack_failed_is_acked_later_never_rerun,
    test_g6_an_ack_whose_reply_was_lost_leaves_no_stray_behind,
    test_g7_a_stray_on_a_live_workers_list_is_requeued_when_seen_twice,
    test_g8_sigterm_interrupts_a_job_past_the_timeout_files_it_in_retry_and_deregisters,
    test_g9_paused_queues_are_skipped,
    test_g12_a_broken_in_progress_list_does_not_stop_recovery_of_others_nor_the_poller,
    test_g12_a_queue_key_of_the_wrong_type_does_not_stop_the_other_queues,
    test_g13_bad_payloads_are_filed_in_dead_with_raw_kept_and_the_worker_goes_on,
    test_g14_a_job_raising_any_exception_never_kills_its_thread,
    test_g14_close_old_connections_before_and_after_each_job_in_a_worker,
)
from tests.test_revival import (  # noqa: F401
    test_g18_a_job_fetched_long_ago_but_still_owned_runs,
    test_g18_a_late_ack_of_a_revived_process_leaves_the_new_owners_orphan_counter,
    test_g18_a_late_failure_of_a_revived_process_is_not_filed,
    test_g18_a_revived_process_does_not_start_a_job_fetched_before_it_stopped,
)
from tests.test_supervisor import (  # noqa: F401
    test_g20_a_child_that_dies_is_replaced,
    test_g20_a_child_that_does_not_stop_is_sigkilled_and_its_job_recovered,
    test_g20_children_stop_when_the_supervisor_is_sigkilled_and_their_jobs_are_settled,
)
from tests.topology import ClusterGroup, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

GROUP = "all"

#: The queues the tests use (testproject's QUEUES, and G5's broken one), in one group.
QUEUES = ["default", "mail", "low", "broken"]

#: Key suffixes that stay in the shared ``{N}`` slot (docs/redis-layout.md);
#: ``process:<id>`` is the record the admin shows (its group's is a presence).
SHARED = ("queues", "paused", "process", "workers:", "signals:", "stat:", "metrics:", "recovery", "limits")


@pytest.fixture(autouse=True)
def sharded_layout(
    cog: CogEnv,
    monkeypatch: pytest.MonkeyPatch,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> Iterator[None]:
    with one_group(cog, monkeypatch, redis_cluster, QUEUES, lambda s: s.startswith(SHARED)):
        yield


@contextmanager
def one_group(
    cog: CogEnv,
    monkeypatch: pytest.MonkeyPatch,
    cluster: ClusterGroup,
    queues: list[str],
    shared: Callable[[str], bool],
) -> Iterator[None]:
    """``SHARDING = "queues"`` in a fresh namespace, ``queues`` in the group
    ``GROUP``; the tests' key names (``cog.key()``, the guarantee modules'
    ``keys()``) follow it, ``shared(suffix)`` telling those in ``{N}``."""
    namespace = f"s{uuid.uuid4().hex[:12]}"
    cog.namespace = namespace
    cog.configure(NAMESPACE=namespace, SHARDING="queues", QUEUE_GROUPS={GROUP: queues})
    group = get_keys().group(GROUP)

    def key_of(suffix: str) -> str:
        if suffix.startswith("queue:"):
            return group.queue(suffix.removeprefix("queue:"))
        if shared(suffix):
            return f"{{{namespace}}}:{suffix}"
        return f"{group.tag}:{suffix}"

    cog.key_of = key_of
    cog.worker_args = ("--skip-checks",)  # faster starts; tests/test_sharded_workflows.py runs the checks
    for module in (guarantees, test_revival, test_bounds, test_supervisor, test_chaos):
        monkeypatch.setattr(module, "keys", lambda: get_keys().group(GROUP))
    yield
    client = cluster.client()
    try:
        delete_sharded(client, namespace)
    finally:
        client.close()
