"""G22, batches and the admin (SPEC section 13): members retried from
the Dead page before their batch settled count as live again, members
killed or deleted from the Retry page (one by one, in bulk, or the whole
set), or cleared with their queue, count as dead. Through the admin's own
pages (Django's test client), with real worker processes.
"""

from __future__ import annotations

from typing import Any

from django_cogworker import api, batch
from testproject.testapp import batch_jobs
from tests.conftest import CogEnv, wait_for
from tests.test_admin import BASE, detail_url, messages_of
from tests.test_batches_chaos import callbacks
from tests.test_batches_faults import (
    STALL_S,
    assert_settled_once,
    callback_figures,
    callback_runs,
    fired,
    go,
    ran,
    wait_fired,
)


def test_g22_dead_members_retried_from_the_admin_before_settling_bring_success_back(
    cog: CogEnv, superclient: Any
) -> None:
    cog.start_worker().identity()
    with batch(description="retried by hand", **callbacks()) as b:
        batch_jobs.gated.delay("gate")
        one = batch_jobs.doomed_once.delay("one")  # retried from its own page
        two = batch_jobs.doomed_once.delay("two")  # retried with the bulk action
        batch_jobs.member.delay_many([((0, f"q{i}"), {}) for i in range(5)])
    wait_for(lambda: batch_jobs.figures(b.bid)["dead"] == 2, STALL_S, "both members dead")
    wait_fired(cog, b.bid, "death")
    assert callback_figures(cog, b.bid, "death")["dead"] >= 1

    record = api.DeadSet().find(str(one))
    assert record is not None
    response = superclient.post(detail_url("dead", record) + "action/", {"action": "retry"}, follow=True)
    assert f"Retried job {one}" in " ".join(messages_of(response))
    record = api.DeadSet().find(str(two))
    assert record is not None
    response = superclient.post(
        BASE + "dead/action/",
        {"action": "retry", "_selected_action": [record.id], "post": "yes"},
        follow=True,
    )
    assert "Retried 1 of 1 jobs" in " ".join(messages_of(response))
    wait_for(lambda: ran(cog, str(one)) and ran(cog, str(two)), STALL_S, "the retried members to succeed")
    # Each is moved out of pending by its ack, sent after its note.
    wait_for(lambda: batch_jobs.figures(b.bid)["pending"] == 1, STALL_S, "the retried members' acks")
    seen = batch_jobs.figures(b.bid)
    assert (seen["dead"], seen["failed"], seen["pending"], seen["fired"]) == (0, 0, 1, ["death"]), seen
    go(cog, "gate")
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"death", "success", "complete", "settled"})
    success = callback_figures(cog, b.bid, "success")
    assert success["succeeded"] == success["total"] == 8 and success["dead"] == 0, success
    print(f"\nadmin retries: fired {fired(b.bid)}, callback runs {dict(callback_runs(cog))}")


def test_g22_members_killed_or_deleted_from_the_admin_count_as_dead(cog: CogEnv, superclient: Any) -> None:
    cog.start_worker().identity()
    names = ("deleted", "bulk-deleted", "killed")
    with batch(description="removed by hand", **callbacks()) as b:
        batch_jobs.gated.delay("gate")
        jids = {name: str(batch_jobs.fail_into_retry.delay(name)) for name in names}
        later = str(batch_jobs.member.delay_in(3600, 0, "later"))  # deleted from the Scheduled page
        batch_jobs.member.delay_many([((0, f"q{i}"), {}) for i in range(3)])
    wait_for(lambda: batch_jobs.figures(b.bid)["failed"] == 3, STALL_S, "the three members waiting in retry")
    scheduled = api.ScheduledSet().find(later)
    assert scheduled is not None
    superclient.post(detail_url("scheduled", scheduled) + "action/", {"action": "delete"})

    def record(name: str) -> api.JobRecord:
        found = api.RetrySet().find(jids[name])
        assert found is not None, name
        return found

    superclient.post(detail_url("retries", record("deleted")) + "action/", {"action": "delete"})
    wait_fired(cog, b.bid, "death")
    for name, action in (("bulk-deleted", "delete"), ("killed", "kill")):
        done = superclient.post(
            BASE + "retries/action/",
            {"action": action, "_selected_action": [record(name).id], "post": "yes"},
            follow=True,
        )
        assert "1 of 1 jobs" in " ".join(messages_of(done)), name
    seen = batch_jobs.figures(b.bid)
    assert (seen["dead"], seen["failed"], seen["pending"]) == (4, 0, 1), seen
    go(cog, "gate")
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"death", "complete", "settled"})
    [killed] = api.DeadSet()
    assert killed.jid == jids["killed"]
    # Retried after its batch settled: it runs (and fails into retry again),
    # and its batch stays as it was.
    settled = batch_jobs.figures(b.bid)
    superclient.post(detail_url("dead", killed) + "action/", {"action": "retry"})
    wait_for(lambda: api.RetrySet().find(jids["killed"]) is not None, STALL_S, "the retried member to run")
    assert batch_jobs.figures(b.bid) == settled
    assert_settled_once(cog, b.bid, {"death", "complete", "settled"})
    print(f"\nadmin kill/delete: {batch_jobs.figures(b.bid)}, callback runs {dict(callback_runs(cog))}")


def test_g22_members_deleted_with_every_job_of_the_retry_page_count_as_dead(
    cog: CogEnv, superclient: Any
) -> None:
    """ "Delete" on every job of the Retry page, no filter: each member it
    deletes counts as dead, as when deleted one by one."""
    cog.start_worker().identity()
    with batch(description="cleared by hand", **callbacks()) as b:
        batch_jobs.gated.delay("gate")
        for name in ("cleared-1", "cleared-2"):
            batch_jobs.fail_into_retry.delay(name)
    wait_for(lambda: api.RetrySet().size == 2, STALL_S, "the members waiting in retry")
    superclient.post(BASE + "retries/action/", {"action": "delete", "select_across": "1", "post": "yes"})
    assert api.RetrySet().size == 0
    seen = batch_jobs.figures(b.bid)
    assert (seen["dead"], seen["failed"], seen["pending"]) == (2, 0, 1), seen
    go(cog, "gate")
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"death", "complete", "settled"})


def test_g22_members_cleared_with_their_queue_from_the_admin_count_as_dead(
    cog: CogEnv, superclient: Any
) -> None:
    """ "Clear queue": each member it deletes counts as dead."""
    cog.start_worker().identity()  # serves "default" only: the members on "mail" stay queued
    with batch(description="queue cleared by hand", **callbacks()) as b:
        batch_jobs.gated.delay("gate")
        batch_jobs.member.set(queue="mail").delay_many([((0, f"m{i}"), {}) for i in range(3)])
    superclient.post(BASE + "queues/mail/clear/")
    assert api.Queue("mail").size == 0
    seen = batch_jobs.figures(b.bid)
    assert (seen["dead"], seen["pending"]) == (3, 1), seen
    go(cog, "gate")
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"death", "complete", "settled"})
