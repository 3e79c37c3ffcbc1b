"""How a batch member's other ends count (SPEC section 13, G22), each moved
in the same script as the end itself: killed or deleted from the admin's
API, or buried as a poison pill (G3): dead; retried from dead before the
batch settled: live again; dropped as expired (section 14): succeeded;
recovered from a dead process: still pending, nothing fires.
"""

from __future__ import annotations

import json
import signal
import time
from types import SimpleNamespace

from django_cogworker import api, batch
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.keys import Keys
from django_cogworker.launcher import Launcher
from django_cogworker.payload import decode
from django_cogworker.settle import file_unsettled
from testproject.testapp import jobs
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, wait_for
from tests.test_batches import STALL_S, batch_hash, callbacks_enqueued, members, wait_callbacks, wait_settled


def keys() -> Keys:
    """The keys the in-process calls take (the sharded run's group's)."""
    return get_keys()


def test_g22_a_member_killed_from_the_admin_is_dead(cog: CogEnv) -> None:
    with batch(
        on_success=wf.callback.s("ok"), on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")
    ) as b:
        jid = jobs.record.delay("killed")
    (entry,) = list(api.Queue("default"))
    assert entry.kill()
    assert members(cog, b.bid, "dead") == {jid}
    assert members(cog, b.bid, "pending") == set()
    assert callbacks_enqueued(cog, b.bid) == sorted([f"{b.bid}-death", f"{b.bid}-settled"])
    assert "fired:success" not in batch_hash(cog, b.bid)


def test_g22_a_member_deleted_from_the_admin_is_dead(cog: CogEnv) -> None:
    with batch(on_settled=wf.callback.s("fin")) as b:
        jid = jobs.record.delay_in(3600, "deleted")
        jobs.record.delay_in(3600, "kept")
    deleted = next(e for e in api.ScheduledSet() if e.jid == jid)
    assert deleted.delete()
    assert members(cog, b.bid, "dead") == {jid}
    assert "settled_at" not in batch_hash(cog, b.bid), "the other member is still pending"
    assert api.DeadSet().size == 0, "deleted, not filed"
    assert [e.jid for e in api.ScheduledSet()] != [jid] and api.ScheduledSet().size == 1


def test_g22_a_dead_member_retried_before_settlement_is_live_again(cog: CogEnv) -> None:
    with batch(
        on_success=wf.callback.s("ok"), on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")
    ) as b:
        dying = wf.dies_in_chain.delay(1)
        later = jobs.record.delay_in(3600, "later")
    cog.start_worker()
    wait_for(lambda: api.DeadSet().size == 1, STALL_S, "the member in dead")
    # On the one-slot layout its death is in its batch in the same step; on
    # the sharded one (test_sharded_workflow_modules.py) it reaches its batch
    # through the group's outbox, a moment after.
    wait_for(lambda: members(cog, b.bid, "dead") == {dying}, STALL_S, "its death in its batch")
    cog.redis.set(cog.key("test:heal"), "1")
    (entry,) = list(api.DeadSet())
    assert entry.retry()
    wait_for(lambda: dying in members(cog, b.bid, "succeeded"), STALL_S, "the retried member to succeed")
    assert members(cog, b.bid, "dead") == set()
    assert next(e for e in api.ScheduledSet() if e.jid == later).retry()
    wait_settled(cog, b.bid)
    runs = wait_callbacks(cog, 3)
    assert sorted(r["tag"] for r in runs) == ["dead", "fin", "ok"]


def test_g22_g3_a_poison_pill_buried_is_a_dead_member(cog: CogEnv) -> None:
    with batch(on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")) as b:
        jid = jobs.record.delay("pill")
    raw = cog.redis.rpop(cog.key("queue:default"))
    cog.redis.rpush(cog.key("repeat_orphans"), raw)
    launcher = Launcher(get_config(), identity="test-burier")
    assert launcher.recovery.bury_repeat_orphans() == 1
    assert members(cog, b.bid, "dead") == {jid}
    assert callbacks_enqueued(cog, b.bid) == sorted([f"{b.bid}-death", f"{b.bid}-settled"])


def test_g22_g3_a_pill_filed_raw_in_dead_by_the_requeue_is_a_dead_member(cog: CogEnv) -> None:
    """requeue.lua files a repeat orphan raw in dead when its parking list
    is unusable; completing that entry moves the member too."""
    with batch(on_settled=wf.callback.s("fin")) as b:
        jid = jobs.record.delay("pill")
    raw = cog.redis.rpop(cog.key("queue:default"))
    cog.redis.zadd(cog.key("dead"), {raw: time.time()})
    Launcher(get_config(), identity="test-burier").recovery.complete_raw_burials([raw])
    assert members(cog, b.bid, "dead") == {jid}
    assert callbacks_enqueued(cog, b.bid) == [f"{b.bid}-settled"]


def test_g22_g8_a_failure_handed_to_unsettled_moves_its_member_when_filed(cog: CogEnv) -> None:
    with batch(on_complete=wf.callback.s("done")) as b:
        jid = jobs.record.delay("handed over")
    raw = cog.redis.rpop(cog.key("queue:default"))
    record = {"set": cog.key("retry"), "score": time.time() + 3600, "payload": raw.decode()}
    cog.redis.rpush(cog.key("unsettled"), json.dumps(record))
    ctx = SimpleNamespace(client=get_redis(), keys=keys(), config=get_config())
    assert file_unsettled(ctx) == 1  # type: ignore[arg-type]
    assert members(cog, b.bid, "failed") == {jid}
    assert callbacks_enqueued(cog, b.bid) == [f"{b.bid}-complete"], "it ran once: complete"


def test_g22_expired_members_count_as_succeeded(cog: CogEnv) -> None:
    """One dropped by the processor (its ack carries the move), one by the
    poller (dropped from the schedule)."""
    with batch(on_success=wf.callback.s("ok"), on_settled=wf.callback.s("fin")) as b:
        now = jobs.expiring.delay("now")
        scheduled = jobs.expiring.delay_in(0.2, "scheduled")
    deadline = max(decode(r)["expires_at"] for r in cog.redis.zrange(cog.key("schedule"), 0, -1))
    wait_for(lambda: cog.redis.time()[0] > deadline + 1, 10, "both deadlines to pass on Redis's clock")
    cog.start_worker()
    wait_settled(cog, b.bid)
    assert members(cog, b.bid, "succeeded") == {now, scheduled}
    assert sorted(r["tag"] for r in wait_callbacks(cog, 2)) == ["fin", "ok"]
    assert cog.notes("runs") == [] or all(r["tag"] not in ("now", "scheduled") for r in cog.notes("runs"))


def test_g22_a_member_recovered_from_a_dead_process_stays_pending(cog: CogEnv) -> None:
    with batch(on_settled=wf.callback.s("fin")) as b:
        jid = jobs.sleep_then_record.delay(2, "slow")
    worker = cog.start_worker()
    wait_for(lambda: cog.notes("started"), STALL_S, "the member to start")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    assert members(cog, b.bid, "pending") == {jid}
    cog.start_worker()
    wait_settled(cog, b.bid)
    (fin,) = wait_callbacks(cog, 1)
    assert members(cog, b.bid, "succeeded") == {jid}
    assert fin["at"] >= max(r["at"] for r in cog.notes("runs"))
