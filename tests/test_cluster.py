"""G16: on a real Redis Cluster (three masters, each with a replica) every
guarantee holds as on one server.

The guarantee tests that do not need a server of their own, the
inspection API, the admin pages and the Tasks backend are collected here a
second time, with ``redis_url`` pointing at the cluster (``REDIS_URL =
"redis+cluster://..."``, a hash-tagged namespace per test). Then what only
a cluster has: the slot owner SIGKILLed mid-run and its replica promoted
(no confirmed job lost, scripts missing on the new master), the key scan of
every master, the capability check, a cluster client from a cache alias.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
import redis.crc

from django_cogworker import connection, errors
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.fetch_mode import reliable_supported
from django_cogworker.scripts import script
from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for
from tests.test_admin import *  # noqa: F403  (the admin pages, on the cluster)
from tests.test_api import *  # noqa: F403  (the inspection API)
from tests.test_batches import (  # G22: every key of a batch's scripts in one slot
    test_g22_child_batches_settle_before_their_parent,  # noqa: F401
    test_g22_deaths_fire_on_death_and_settled_never_success,  # noqa: F401
    test_g22_members_pushed_at_exit_and_each_callback_once,  # noqa: F401
)
from tests.test_batches_ends import (
    test_g22_a_dead_member_retried_before_settlement_is_live_again,  # noqa: F401
    test_g22_g3_a_poison_pill_buried_is_a_dead_member,  # noqa: F401
)
from tests.test_batches_faults import (
    test_g22_g18_a_late_ack_before_the_recovered_run_leaves_the_member_pending,  # noqa: F401
)
from tests.test_chains import (
    test_g22_a_chain_keeps_its_batch_open_until_its_last_step,  # noqa: F401
    test_g22_chord_body_gets_results_in_header_order_once,  # noqa: F401
)
from tests.test_failover import Producer, assert_only_outages, beating_workers
from tests.test_guarantees import (  # the guarantees that need no server of their own
    leftovers,
    runs,
    test_g1_jobs_of_a_sigkilled_worker_all_run_and_each_job_is_always_in_one_place,  # noqa: F401
    test_g2_live_but_silent_owner_keeps_its_jobs,  # noqa: F401
    test_g2_owner_silent_past_the_threshold_loses_its_job_to_another_worker,  # noqa: F401
    test_g2_requeue_script_decides_on_presence_and_last_beat_atomically,  # noqa: F401
    test_g3_a_job_that_kills_its_process_ends_in_dead_after_max_orphanings_plus_one_runs,  # noqa: F401
    test_g3_finishing_a_job_clears_its_orphan_counter,  # noqa: F401
    test_g4_recovered_jobs_run_oldest_first_before_jobs_already_queued,  # noqa: F401
    test_g5_a_job_whose_queue_key_is_broken_rotates_and_does_not_block_the_others,  # noqa: F401
    test_g6_a_failed_job_whose_filing_failed_is_filed_later,  # noqa: F401
    test_g6_a_finished_job_whose_ack_failed_is_acked_later_never_rerun,  # noqa: F401
    test_g6_an_ack_whose_reply_was_lost_leaves_no_stray_behind,  # noqa: F401
    test_g7_a_stray_on_a_live_workers_list_is_requeued_when_seen_twice,  # noqa: F401
    test_g8_sigterm_interrupts_a_job_past_the_timeout_files_it_in_retry_and_deregisters,  # noqa: F401
    test_g9_paused_queues_are_skipped,  # noqa: F401
    test_g12_a_broken_in_progress_list_does_not_stop_recovery_of_others_nor_the_poller,  # noqa: F401
    test_g12_a_queue_key_of_the_wrong_type_does_not_stop_the_other_queues,  # noqa: F401
    test_g13_bad_payloads_are_filed_in_dead_with_raw_kept_and_the_worker_goes_on,  # noqa: F401
)
from tests.test_limits import (  # G23: every key of the limiters' scripts in one slot
    test_g23_concurrency_holds_across_processes_and_waiting_uses_no_retry,  # noqa: F401
    test_g23_queue_limit_one_at_a_time_and_other_queues_run_meanwhile,  # noqa: F401
    test_g23_rate_no_window_holds_more_than_its_starts,  # noqa: F401
)
from tests.test_limits_chaos import (
    test_g23_sigkill_the_holder_of_both_slots_they_come_back_after_the_threshold,  # noqa: F401
)
from tests.test_metrics_robustness import (  # the figures' script, and a beat, on the cluster
    test_a_workers_beat_writes_the_fastest_and_slowest_run_of_each_minute,  # noqa: F401
    test_percentiles_are_clamped_to_the_fastest_and_slowest_run,  # noqa: F401
)
from tests.test_tasks import *  # noqa: F403  (the Tasks backend)
from tests.test_worker_logs import status
from tests.topology import ClusterGroup, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

# Not collected again here: tests that need a server of their own (to count
# its commands, to stop it), that do not depend on where Redis is (logins,
# permissions, CSRF), and the 100k-entry pages, which are one server's. Nor
# the workflows' chaos tests: what a cluster adds to them, every key of each
# script call in one slot, tests/test_script_slots.py checks call by call,
# and the cluster's own failover is test_g16_g11_... below.
for _name in (
    "test_a_selection_of_unsettled_entries_is_found_in_one_read_of_the_list",
    "test_every_page_answers_503_inside_the_admin_when_redis_is_down",
    "test_an_action_posted_while_redis_is_down_answers_503",
    "test_anonymous_and_non_staff_are_sent_to_the_login",
    "test_staff_without_the_app_permissions_is_refused",
    "test_no_change_delete_or_history_urls_for_the_placeholder_model",
    "test_every_change_is_csrf_protected",
    "test_changes_are_refused_by_get",
    "test_a_dead_set_of_100k_pages_with_calls_bounded_by_the_page_or_the_scan",
):
    del globals()[_name]


# -- what only a cluster has ---------------------------------------------------------------------


def test_g16_the_client_is_a_cluster_client_and_reliable_fetch_is_supported(cog: CogEnv) -> None:
    client = get_redis()
    assert isinstance(client, redis.RedisCluster)
    assert get_config().namespace == cog.namespace and cog.namespace.startswith("{")
    assert reliable_supported(client)


def test_g16_status_shards_names_the_slot_and_master_of_the_queues_and_the_idle_masters(
    cog: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """``cogworker_status --shards`` (SPEC section 16) on today's layout:
    every queue in the namespace's slot, on the master that owns it, and a
    warning naming the two masters that hold none."""
    jobs.record.delay("queued")
    jobs.record.set(queue="low").delay("queued")
    code, out, err = status(cog, "--shards", "--json")
    assert code == 1, out + err
    found = json.loads(out)["shards"]
    [group] = found["groups"]
    owner = f"127.0.0.1:{redis_cluster.owner_of(cog.key('queues'))}"
    assert group["slot"] == redis.crc.key_slot(cog.namespace.encode()) and group["master"] == owner, group
    assert {"default", "low"} <= set(group["queues"]), group
    assert found["cluster"] is True and len(found["masters"]) == 3, found
    assert sorted(found["idle_masters"]) == sorted(set(found["masters"]) - {owner}), found
    code, out, _ = status(cog, "--shards")
    assert f"slot {group['slot']} on {owner}, queues " in out, out
    assert "warning: 2 master(s) hold no queue" in out, out


def test_g16_the_boot_scan_finds_an_unregistered_list_on_every_master(cog: CogEnv) -> None:
    """A list whose registration was lost is found by the key scan, which
    redis-py's cluster client sends to every master."""
    k = get_keys()
    raw = jobs.record.payload(("scanned",), {}, time.time())
    from django_cogworker.payload import encode

    cog.redis.lpush(k.inprogress("ghost-1"), encode(raw))
    worker = cog.start_worker()
    wait_for(lambda: [n["tag"] for n in cog.notes()] == ["scanned"], 20, "the scanned job to run")
    wait_for(lambda: leftovers(cog) == {}, 10, "nothing left")
    assert worker.alive()


def test_g16_a_cluster_client_from_a_cache_alias_is_refused(
    cog: CogEnv, monkeypatch: Any, settings: Any
) -> None:
    import django_redis

    monkeypatch.setattr(django_redis, "get_redis_connection", lambda alias: cog.redis)
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": cog.url},
    }
    cog.configure(CACHE_ALIAS="jobs")
    connection.reset()
    with pytest.raises(errors.ConfigurationError, match=r"is a Redis Cluster client.*redis\+cluster://"):
        get_redis()


def test_g16_confirmed_enqueue_on_a_cluster_sync_and_async(cog: CogEnv, redis_cluster: ClusterGroup) -> None:  # noqa: F811
    """WAIT goes to the master of the namespace's slot, on the push's own
    connection (sync pipeline) or after the write of its own (asyncio
    Tasks backend); the replica of that master has the jobs."""
    import asyncio

    from testproject.testapp import tasks

    cog.configure(ENQUEUE_WAIT_REPLICAS=1)
    jids = [jobs.record.delay("sync"), *jobs.record.delay_many([(("many",), {})] * 3)]
    result = asyncio.run(tasks.async_add.aenqueue(1, 2))
    with redis.Redis(port=redis_cluster.owner_of(cog.key("queues"))) as owner:
        replica = int(owner.info("replication")["slave0"]["port"])
    with redis.Redis(port=replica) as node:
        node.execute_command("READONLY")
        assert node.llen(cog.key("queue:default")) == len(jids) + 1
        assert node.exists(get_keys().result(result.id))


def test_g16_g11_the_slot_owner_sigkilled_mid_run_loses_no_confirmed_job(
    cog: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """The master of the namespace's slot is SIGKILLed under load; its
    replica is promoted, with no script in its cache (G11). Every job whose
    enqueue was confirmed by a replica runs at least once, the workers keep
    running (same processes), nothing is left."""
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=0.5, HEARTBEAT_TTL=4, ORPHAN_THRESHOLD=8)
    workers = beating_workers(cog)
    with Producer() as producer:
        wait_for(lambda: len(runs(cog)) >= 30, 20, "the run to get going")
        owner = redis_cluster.owner_of(cog.key("queues"))
        promoted_in = redis_cluster.kill(owner)
        at_promotion = len(producer.confirmed)
        new_owner = redis_cluster.owner_of(cog.key("queues"))
        # G11: the promoted replica's script cache is flushed: every call
        # meets NOSCRIPT once and loads the script again.
        with redis.Redis(port=new_owner) as node:
            node.script_flush()
        # The promoted master has no replica left to confirm enqueues until
        # the killed node is back (as its replica, from its AOF).
        redis_cluster.restart(owner)
        wait_for(lambda: len(producer.confirmed) >= at_promotion + 50, 30, "confirmed enqueues after it")
    confirmed = producer.confirmed
    wait_for(lambda: set(confirmed) <= set(runs(cog)), 60, "every confirmed job to run")
    wait_for(lambda: leftovers(cog) == {}, 30, "nothing left")
    assert all(w.alive() for w in workers)
    # The node's death is an outage (connection errors, CLUSTERDOWN, MOVED
    # while the slot moves), never an error of ours nor a broken queue.
    assert_only_outages("".join(w.log() for w in workers))
    with redis.Redis(port=new_owner) as node:
        # Its next beat (every 0.2 s) meets NOSCRIPT and loads it again.
        loaded = lambda: node.script_exists(script("heartbeat").sha) == [True]  # noqa: E731
        wait_for(loaded, 10, "the worker to load its scripts again")
    print(
        f"\n[cluster] slot owner killed, replica promoted in {promoted_in:.1f}s; {len(confirmed)} confirmed "
        f"enqueues all ran, {len(producer.unconfirmed)} unconfirmed, {producer.refused} refused, "
        f"{sum(n - 1 for n in runs(cog).values())} second runs"
    )
