"""G22 for child batches and members added from a running member (SPEC
section 13) under SIGKILL chaos. Every tick a parent batch opens with
members of its own and two child batches, one of which, every other tick,
has a member that dies; or a batch opens whose members each add members
to it (``current_batch().add``) while they run.

A child's settlement moves it in its parent (``b:<child bid>``, succeeded,
or dead if the child had a death) in the same script: the parent settles
only after its children, a child's death is a dead member of the parent
(``death`` fires in both, ``success`` in neither), and every callback of
every level fires once. A batch waits for the members added to it: it
settles after every one of them (a member killed after its adds runs
again and adds again: every member added runs). ``-s`` prints the figures.
"""

from __future__ import annotations

from django_cogworker import batch
from testproject.testapp import batch_jobs
from tests.conftest import CogEnv
from tests.test_batches_chaos import (
    CONCURRENCY,
    JOB_S,
    Opened,
    assert_callbacks_once,
    batch_chaos,
    callbacks,
)
from tests.test_chaos import process_died, report, shut_down
from tests.test_guarantees import keys

OWN = 50  # the parent's own members
PER_CHILD = 100


def open_family(tick: int) -> list[Opened]:
    """A parent with OWN members and two children; the first child of an
    odd tick has a member that dies."""
    children: list[Opened] = []
    with batch(description=f"parent #{tick}", **callbacks()) as parent:
        own = batch_jobs.member.delay_many([((JOB_S, f"{tick}-p{i}"), {}) for i in range(OWN)])
        for c in range(2):
            with batch(description=f"child #{tick}-{c}", **callbacks()) as child:
                calls = [((JOB_S, f"{tick}-c{c}-{i}"), {}) for i in range(PER_CHILD)]
                jids = batch_jobs.member.delay_many(calls)
                doomed = [batch_jobs.doomed.delay(f"{tick}-c{c}-doomed")] if tick % 2 and not c else []
            children.append(Opened(child.bid, f"child #{tick}-{c}", [*map(str, jids)], [*map(str, doomed)]))
    # A child is a member of its parent: succeeded, or dead if it had a death.
    healthy = [f"b:{o.bid}" for o in children if not o.doomed]
    deadly = [f"b:{o.bid}" for o in children if o.doomed]
    return [Opened(parent.bid, f"parent #{tick}", [*map(str, own), *healthy], deadly), *children]


def test_g22_child_batches_under_sigkill_chaos_parents_settle_after_their_children(cog: CogEnv) -> None:
    chaos, opened, sampled = batch_chaos(cog, open_family)
    extra = assert_callbacks_once(chaos, opened)
    fields = {o.bid: cog.redis.hgetall(keys().batch(o.bid)) for o in opened}
    parents = [o for o in opened if o.description.startswith("parent")]
    for parent in parents:
        assert fields[parent.bid][b"parent"] == b""
        children = [m[2:] for m in parent.members + parent.doomed if m.startswith("b:")]
        assert len(children) == 2
        for child in children:
            assert fields[child][b"parent"] == parent.bid.encode()
            # The parent settled after its child, in the script that settled the child or later.
            assert float(fields[parent.bid][b"settled_at"]) >= float(fields[child][b"settled_at"])
    lost, second_runs = report(
        chaos,
        "child batches, SIGKILL",
        f"{extra} ({len(parents)} parents with two children each), {sampled.samples} figure samples",
    )
    assert sampled.faults == [], sampled.faults[:5]
    assert not lost
    assert second_runs <= chaos.hits * CONCURRENCY
    assert process_died(cog) == []
    cog.redis.delete(keys().dead)  # the doomed members, where they should be: not leftovers
    shut_down(cog, chaos.workers)


FAN_OUTS = 40  # members per batch that each add ADDS members
ADDS = 4


def test_g22_members_added_from_running_members_under_sigkill_chaos_the_batch_waits_for_them(
    cog: CogEnv,
) -> None:
    def open_fan_out(tick: int) -> Opened:
        with batch(description=f"fan-out #{tick}", **callbacks()) as b:
            calls = [((ADDS, JOB_S, f"{tick}-f{i}"), {}) for i in range(FAN_OUTS)]
            jids = batch_jobs.fan_out.delay_many(calls)
        return Opened(b.bid, f"fan-out #{tick}", [*map(str, jids)])

    chaos, opened, sampled = batch_chaos(cog, open_fan_out)
    runs = cog.notes()
    for o in opened:
        # The members added: every one ran, each counted in the batch (more
        # than ADDS per fan-out when a kill made one run again and add again).
        added = {n["jid"] for n in runs if n["bid"] == o.bid} - set(o.members)
        tags = {n["tag"] for n in runs if n["bid"] == o.bid and n["jid"] in added}
        assert tags == {f"{m['tag']}-{i}" for m in runs if m["jid"] in o.members for i in range(ADDS)}
        o.members += sorted(added)
    extra = assert_callbacks_once(chaos, opened)
    lost, second_runs = report(
        chaos,
        "members adding members, SIGKILL",
        f"{extra}, {sum(len(o.members) for o in opened) - len(opened) * FAN_OUTS} members added "
        f"(at least {len(opened) * FAN_OUTS * ADDS}), {sampled.samples} figure samples",
    )
    assert sampled.faults == [], sampled.faults[:5]
    assert not lost
    assert second_runs <= chaos.hits * CONCURRENCY
    assert process_died(cog) == []
    shut_down(cog, chaos.workers)
