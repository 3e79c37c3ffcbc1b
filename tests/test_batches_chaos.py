"""G22, batches under SIGKILL chaos (SPEC section 13): real worker
processes SIGKILLed at random while batches of a few hundred members, each
with its four callbacks, stream through them.

Every tick one batch is opened and a random worker is SIGKILLed and
replaced (``tests/test_chaos.py``'s ``sigkill``). A sampler thread reads
every batch's figures the whole time (one MULTI/EXEC per batch): each
member in exactly one of pending/failed/succeeded/dead, no event fired
before its condition. At the end: every member ran, each callback fired
once (``fired:<event>``, jid ``<bid>-<event>``) and ran no more often than
the kills that caught it allow, and when it ran its condition held (it
notes its batch's figures at its start). Chains and chords under the same
chaos are in ``tests/test_chains_chaos.py``. ``-s`` prints the figures;
``COGWORKER_CHAOS_SEED`` replays a run.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django_cogworker import api, batch
from testproject.testapp import batch_jobs
from tests.conftest import CogEnv, Worker
from tests.test_chaos import (
    Chaos,
    held_when_killed,
    process_died,
    report,
    shut_down,
    sigkill,
    tick_and_hit,
    wait_while_moving,
)
from tests.test_guarantees import assert_each_in_one_place, keys, leftovers

WORKERS = 3
CONCURRENCY = 4
TICKS = 10  # one batch opened and one worker SIGKILLed per tick
TICK_S = 1.0
MEMBERS = 250  # per batch: more than the workers get through in a tick, so they are busy when hit
JOB_S = 0.05
EVENTS = ("success", "complete", "death", "settled")


def callbacks() -> dict[str, Any]:
    """The four callbacks of a batch: each notes its event and its batch's figures."""
    return {f"on_{event}": batch_jobs.on_event.s(event) for event in EVENTS}


@dataclass
class Opened:
    bid: str
    description: str
    members: list[str]  # those expected to succeed
    doomed: list[str] = field(default_factory=list)  # those expected to die

    @property
    def jobs(self) -> list[str]:
        """Its members that are jobs (a child batch is a member ``b:<bid>``)."""
        return [jid for jid in self.members + self.doomed if not jid.startswith("b:")]

    @property
    def expected(self) -> set[str]:
        return {"complete", "settled", "death"} if self.doomed else {"success", "complete", "settled"}


# -- what the sampler checks -------------------------------------------------------------


def figure_faults(bid: str, seen: dict[str, Any], before: dict[str, Any] | None) -> list[str]:
    """What is wrong in one snapshot of a batch's figures (and against the one before)."""
    faults = []
    parts = ("pending", "failed", "succeeded", "dead")
    if any(seen[p] < 0 for p in (*parts, "total")):
        faults.append("a negative figure")
    if sum(seen[p] for p in parts) != seen["total"]:
        faults.append("members not each in exactly one of pending/failed/succeeded/dead")
    fired = set(seen["fired"])
    if fired & {"complete", "settled", "success"} and (seen["pending"] or seen["open"]):
        faults.append("complete/settled/success fired with members pending")
    if fired & {"settled", "success"} and seen["failed"]:
        faults.append("settled/success fired with members waiting for a retry")
    if "success" in fired and seen["dead"]:
        faults.append("success fired with a dead member")
    if "death" in fired and not seen["dead"]:
        faults.append("death fired with no dead member")
    if before is not None:
        if not set(before["fired"]) <= fired:
            faults.append("an event fired went back to not fired")
        if seen["succeeded"] < before["succeeded"] or seen["total"] < before["total"]:
            faults.append("succeeded or total went down")
    return [f"batch {bid}: {fault}: {seen} (before: {before})" for fault in faults]


@dataclass
class Sampling:
    bids: list[str] = field(default_factory=list)
    samples: int = 0
    faults: list[str] = field(default_factory=list)


@contextmanager
def sampling(every_s: float = 0.05) -> Iterator[Sampling]:
    """Samples the figures of every batch in ``.bids`` while the block runs."""
    state = Sampling()
    last: dict[str, dict[str, Any]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for bid in list(state.bids):
                seen = batch_jobs.figures(bid)
                state.faults += figure_faults(bid, seen, last.get(bid))
                # What api.Batch shows (read without MULTI: its figures need not add up mid-move).
                shown = api.Batch(bid).figures()
                if min(shown.total, shown.pending, shown.failed, shown.succeeded, shown.dead) < 0:
                    state.faults.append(f"batch {bid}: api.Batch shows a negative figure: {shown}")
                last[bid] = seen
                state.samples += 1
            done.wait(every_s)

    thread = threading.Thread(target=sample, name="batch-sampler", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        done.set()
        thread.join(10)


# -- the chaos ---------------------------------------------------------------------------


def finished(cog: CogEnv, opened: list[Opened]) -> bool:
    """Every member ran or died, every expected callback ran, nothing left
    anywhere but the doomed members in dead."""
    ran = {n["jid"] for n in cog.notes()}
    called = {n["jid"] for n in cog.notes("callbacks")}
    left = leftovers(cog)
    doomed = sum(1 for o in opened for jid in o.doomed if jid in o.jobs)
    return (
        all({jid for jid in o.members if jid in o.jobs} <= ran for o in opened)
        and all(f"{o.bid}-{event}" in called for o in opened for event in o.expected)
        and left.pop("dead", 0) == doomed
        and left == {}
    )


#: What happens to the worker hit in a tick (``tests/test_chaos.py``'s ``sigkill``).
Hit = Callable[[Chaos, list[Worker], int], None]


def hit_every_tick(
    cog: CogEnv, each_tick: Callable[[int], list[str]], done: Callable[[], bool], hit: Hit = sigkill
) -> Chaos:
    """Calls ``each_tick`` (it enqueues, and returns the jids expected to
    run) and hits a random worker every tick (SIGKILLed and replaced,
    unless ``hit`` says otherwise); returns once ``done()``, failing only
    when nothing moved for STALL_S."""
    seed = int(os.environ.get("COGWORKER_CHAOS_SEED", random.randrange(1_000_000)))
    print(f"COGWORKER_CHAOS_SEED={seed} replays this run")  # shown when the test fails
    rng = random.Random(seed)
    # No job may be parked as a poison pill by the kills alone.
    cog.configure(CONCURRENCY=CONCURRENCY, MAX_ORPHANINGS=TICKS + 1)
    chaos = Chaos(cog, seed)
    workers: list[Worker] = [cog.start_worker() for _ in range(WORKERS)]
    for worker in workers:
        worker.identity()
    tick_and_hit(chaos, workers, rng, each_tick, hit)
    wait_while_moving(cog, done, "every job run, every batch settled, nothing left")
    assert_each_in_one_place(cog, chaos.jids)
    chaos.samples += 1
    chaos.workers = workers
    return chaos


def batch_chaos(
    cog: CogEnv, open_one: Callable[[int], Opened | list[Opened]], hit: Hit = sigkill
) -> tuple[Chaos, list[Opened], Sampling]:
    """A batch (or a batch and its children) opened per tick of
    :func:`hit_every_tick`, their figures sampled throughout."""
    opened: list[Opened] = []

    def each_tick(tick: int) -> list[str]:
        got = open_one(tick)
        new = got if isinstance(got, list) else [got]
        opened.extend(new)
        sampled.bids.extend(o.bid for o in new)
        return [jid for o in new for jid in o.members if jid in o.jobs]

    with sampling() as sampled:
        chaos = hit_every_tick(cog, each_tick, lambda: finished(cog, opened), hit)
    assert_each_in_one_place(cog, [jid for o in opened for jid in o.doomed if jid in o.jobs])
    return chaos, opened, sampled


def assert_callbacks_once(
    chaos: Chaos, opened: list[Opened], reruns: Callable[[str], int] | None = None
) -> str:
    """Each expected callback fired once and ran, no more often than the
    hits that caught it allow (``reruns(jid)``; by default the kills of a
    process holding it), its condition true at its start; the others
    never. Returns the figures to print."""
    allowed = reruns or (lambda jid: held_when_killed(chaos, jid)[0])
    cog = chaos.cog
    notes = cog.notes("callbacks")
    runs = Counter(n["jid"] for n in notes)
    ended: dict[str, float] = {}  # member jid -> when its first run ended (succeeded or not)
    for kind in ("runs", "failed", "doomed"):
        for n in cog.notes(kind):
            ended[n["jid"]] = min(n["at"], ended.get(n["jid"], n["at"]))
    callback_reruns = 0
    for o in opened:
        k = keys()
        assert int(cog.redis.zscore(k.batches, o.bid) or 0) > 0, f"batch {o.bid} not in N:batches"
        fields = {f.decode(): v for f, v in cog.redis.hgetall(k.batch(o.bid)).items()}
        for event in EVENTS:
            jid = f"{o.bid}-{event}"
            assert f"cb:{event}" in fields, f"batch {o.bid} has no {event} callback recorded"
            if event not in o.expected:
                assert f"fired:{event}" not in fields and runs[jid] == 0, f"{jid} fired: {fields}"
                continue
            assert f"fired:{event}" in fields, f"{jid} ran but fired:{event} is not set"
            held = allowed(jid)
            assert 1 <= runs[jid] <= 1 + held, f"{jid} ran {runs[jid]} times, {held} re-runs allowed"
            callback_reruns += runs[jid] - 1
            first = min((n for n in notes if n["jid"] == jid), key=lambda n: n["at"])
            assert (first["label"], first["event"], first["bid"]) == (event, event, o.bid), first
            assert first["description"] == o.description, first
            seen = first["figures"]
            assert seen["pending"] == 0 or event == "death", f"{jid} ran with members pending: {seen}"
            if event in ("success", "settled"):
                assert seen["failed"] == 0, f"{jid} ran with members waiting for a retry: {seen}"
                assert seen["succeeded"] + seen["dead"] == seen["total"] == len(o.members + o.doomed), seen
            if event == "success":
                assert seen["dead"] == 0, seen
            if event == "death":
                assert seen["dead"] >= 1, seen
            else:
                # Its run began after the first end of every member (notes: at their end).
                assert first["at"] >= max(ended[j] for j in o.jobs), jid
        final = batch_jobs.figures(o.bid)
        assert final["pending"] == final["failed"] == 0 and not final["open"], final
        shown = api.Batch(o.bid)
        assert (shown.total, shown.succeeded, shown.dead, shown.pending, shown.settled) == (
            len(o.members + o.doomed),
            len(o.members),
            len(o.doomed),
            0,
            True,
        )
        assert set(shown.fired) == o.expected and shown.description == o.description
        assert (final["total"], final["succeeded"], final["dead"]) == (
            len(o.members + o.doomed),
            len(o.members),
            len(o.doomed),
        ), final
    fired = sum(len(o.expected) for o in opened)
    # The same try started twice: its first start was cut by a kill.
    starts = Counter((n["jid"], n["retry_count"]) for n in cog.notes("started"))
    restarted = sum(count - 1 for count in starts.values())
    return (
        f", {len(opened)} batches, {fired} callbacks fired once ({callback_reruns} re-runs after a hit), "
        f"{restarted} members started again after a hit"
    )


def open_plain(tick: int) -> Opened:
    """A batch of MEMBERS short members, with its four callbacks."""
    description = f"chaos #{tick}"
    with batch(description=description, **callbacks()) as b:
        jids = batch_jobs.member.delay_many([((JOB_S, f"{tick}-{i}"), {}) for i in range(MEMBERS)])
    return Opened(b.bid, description, [str(jid) for jid in jids])


def test_g22_sigkill_chaos_each_callback_enqueued_once_after_its_condition_nothing_lost(cog: CogEnv) -> None:
    chaos, opened, sampled = batch_chaos(cog, open_plain)
    extra = assert_callbacks_once(chaos, opened)
    lost, second_runs = report(chaos, "batches, SIGKILL", f"{extra}, {sampled.samples} figure samples")
    assert sampled.faults == [], sampled.faults[:5]
    assert sampled.samples > 0
    assert not lost, f"{len(lost)} members never ran"
    assert second_runs <= chaos.hits * CONCURRENCY
    assert chaos.held_at_hits > 0, "no kill caught a worker holding jobs: the test proved nothing"
    assert process_died(cog) == []
    shut_down(cog, chaos.workers)


def test_g22_sigkill_chaos_with_retries_and_deaths_death_once_success_never(cog: CogEnv) -> None:
    """Every fifth member fails once then succeeds (retried); every other
    batch has two members that always fail with ``retry=0`` (dead)."""

    def open_one(tick: int) -> Opened:
        description = f"chaos with deaths #{tick}"
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((JOB_S, f"{tick}-{i}"), {}) for i in range(MEMBERS)
        ]
        with batch(description=description, **callbacks()) as b:
            jids = batch_jobs.member.delay_many([c for i, c in enumerate(calls) if i % 5])
            jids += batch_jobs.flaky.delay_many([c for i, c in enumerate(calls) if not i % 5])
            doomed = [batch_jobs.doomed.delay(f"{tick}-doomed-{i}") for i in range(2 * (tick % 2))]
        return Opened(b.bid, description, [str(jid) for jid in jids], [str(jid) for jid in doomed])

    chaos, opened, sampled = batch_chaos(cog, open_one)
    extra = assert_callbacks_once(chaos, opened)
    failed_once = len({n["jid"] for n in cog.notes("failed")})
    lost, second_runs = report(
        chaos,
        "batches with retries and deaths, SIGKILL",
        f"{extra}, {failed_once} members failed once, "
        f"{sum(len(o.doomed) for o in opened)} dead, {sampled.samples} figure samples",
    )
    assert sampled.faults == [], sampled.faults[:5]
    assert not lost, f"{len(lost)} members never ran"
    assert failed_once > 0, "no member failed: the retries proved nothing"
    assert second_runs <= chaos.hits * CONCURRENCY
    assert {n["jid"] for n in cog.notes("doomed")} == {j for o in opened for j in o.doomed}
    assert process_died(cog) == []
    cog.redis.delete(keys().dead)  # the doomed members, where they should be: not leftovers
    shut_down(cog, chaos.workers)
