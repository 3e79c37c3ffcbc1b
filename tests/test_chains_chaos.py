"""G22 for chains and chords (SPEC section 13) under chaos: real worker
processes SIGKILLed, or SIGSTOPped past ORPHAN_THRESHOLD and continued, at
random (``tests/test_batches_chaos.py``'s ``hit_every_tick``) while chains
of short steps, chains inside a batch, and chords of fifty header members
stream through them.

Each step runs at least once, after the previous one succeeded, with the
previous step's result; each step is enqueued once (one jid per step: the
ack that pushes the next one is the script that records the end of the
current one, and a late ack of a revived process pushes nothing); a batch
of chains settles after their last steps; a chord's body is enqueued once,
with every header result in header order. ``-s`` prints the figures;
``COGWORKER_CHAOS_SEED`` replays.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from django_cogworker import batch, chain, chord, group
from testproject.testapp import batch_jobs
from tests.conftest import FAST, CogEnv, Worker
from tests.test_batches_chaos import CONCURRENCY, callbacks, hit_every_tick
from tests.test_chaos import Chaos, held_when_killed, process_died, report, shut_down, sigkill
from tests.test_guarantees import leftovers

CHAINS_PER_TICK = 12
CHAINS_IN_A_BATCH = 3  # per tick, besides
STEPS = 5
STEP_S = 0.1
HEADER = 50
HEADER_S = 0.05


class StopAndContinue:
    """A hit: the worker is SIGSTOPped, and continued at the first tick
    past ORPHAN_THRESHOLD (+1.5 s) after, one stopped at a time, so that
    the others recover its jobs meanwhile."""

    def __init__(self) -> None:
        self.stopped: list[tuple[Worker, float]] = []
        self.stops = 0

    def __call__(self, chaos: Chaos, workers: list[Worker], index: int) -> None:
        for worker, at in list(self.stopped):
            if time.monotonic() - at > FAST["ORPHAN_THRESHOLD"] + 1.5:
                worker.signal(signal.SIGCONT)
                self.stopped.remove((worker, at))
        if not self.stopped:
            # The drawn worker, unless it runs no job now and another does:
            # a stop proves something only of a worker caught mid-run (on a
            # loaded machine the draw alone often catches none).
            running = running_pids(chaos.cog)
            if workers[index].pid not in running:
                index = next((i for i, w in enumerate(workers) if w.pid in running), index)
            workers[index].signal(signal.SIGSTOP)
            self.stopped.append((workers[index], time.monotonic()))
            self.stops += 1

    def continue_all(self) -> None:
        for worker, _ in self.stopped:
            worker.signal(signal.SIGCONT)


def running_pids(cog: CogEnv) -> set[int]:
    """The processes with a job started and not finished now, from the notes."""
    finished = {(n["jid"], n["pid"]) for n in cog.notes()}
    return {n["pid"] for n in cog.notes("started") if (n["jid"], n["pid"]) not in finished}


def by_step(notes: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for note in notes:
        if note["tag"][0] != "square":
            found[(note["tag"][0], note["tag"][1])].append(note)
    return found


def chain_of(chain_id: str) -> str:
    steps = [batch_jobs.link.s(chain_id, i, STEP_S) for i in range(STEPS)]
    return str(chain(*steps).delay())


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_g22_chains_and_chords_under_chaos_each_step_and_body_enqueued_once(cog: CogEnv, how: str) -> None:
    chains: list[str] = []
    batched: dict[str, list[str]] = {}  # bid -> its chains
    chords: dict[str, str] = {}  # body tag -> the chord's bid

    def each_tick(tick: int) -> list[str]:
        firsts = []
        for c in range(CHAINS_PER_TICK):
            chains.append(f"c{tick}-{c}")
            firsts.append(chain_of(chains[-1]))
        with batch(description=f"chains #{tick}", **callbacks()) as b:
            inside = [f"b{tick}-{c}" for c in range(CHAINS_IN_A_BATCH)]
            firsts += [chain_of(chain_id) for chain_id in inside]
        batched[b.bid] = inside
        chains.extend(inside)
        if tick % 2 == 0:
            tag = f"chord-{tick}"
            header = group(batch_jobs.square.s(i, HEADER_S) for i in range(HEADER))
            chords[tag] = str(chord(header, batch_jobs.gather.s(tag=tag)).delay())
        return firsts

    def done() -> bool:
        ran = by_step(cog.notes())
        called = {n["jid"] for n in cog.notes("callbacks")}
        return (
            all(ran.get((c, STEPS - 1)) for c in chains)
            and set(chords) <= {n["tag"] for n in cog.notes("bodies")}
            and all(f"{bid}-settled" in called for bid in batched)
            and leftovers(cog) == {}
        )

    stopper = StopAndContinue()
    try:
        chaos = hit_every_tick(cog, each_tick, done, sigkill if how == "sigkill" else stopper)
    finally:
        stopper.continue_all()
    allowed: Callable[[str], int] = (
        (lambda jid: held_when_killed(chaos, jid)[0]) if how == "sigkill" else (lambda jid: stopper.stops)
    )

    runs, started = by_step(cog.notes()), by_step(cog.notes("started"))
    step_reruns = 0
    for chain_id in chains:
        for i in range(STEPS):
            notes, starts = runs[(chain_id, i)], started[(chain_id, i)]
            jids = {n["jid"] for n in notes + starts}
            assert len(jids) == 1, f"step {i} of {chain_id} enqueued {len(jids)} times: {sorted(jids)}"
            [jid] = jids
            assert all(n["so_far"] == (list(range(i)) if i else None) for n in notes + starts), notes
            assert len(starts) <= 1 + allowed(jid), f"{jid} started {len(starts)} times"
            step_reruns += len(starts) - 1
            if i:
                # Started only after the previous step ended (its note comes before its ack).
                previous_end = min(n["at"] for n in runs[(chain_id, i - 1)])
                assert min(n["at"] for n in starts) >= previous_end, (chain_id, i)

    called = Counter(n["jid"] for n in cog.notes("callbacks"))
    for bid, inside in batched.items():
        last_steps = [n["at"] for c in inside for n in runs[(c, STEPS - 1)]]
        for event in ("success", "complete", "settled"):
            first = min(n["at"] for n in cog.notes("callbacks") if n["jid"] == f"{bid}-{event}")
            assert first >= min(last_steps), f"{bid}-{event} ran before a chain's last step ended"
            assert called[f"{bid}-{event}"] <= 1 + allowed(f"{bid}-{event}")
        seen = batch_jobs.figures(bid)
        assert (seen["total"], seen["succeeded"], seen["pending"]) == (CHAINS_IN_A_BATCH * STEPS,) * 2 + (0,)
        assert seen["fired"] == ["complete", "settled", "success"], seen

    bodies = cog.notes("bodies")
    body_runs = 0
    for tag, bid in chords.items():
        notes = [n for n in bodies if n["tag"] == tag]
        jids = {n["jid"] for n in notes}
        assert len(jids) == 1, f"the body of {tag} enqueued {len(jids)} times"
        assert len(notes) <= 1 + allowed(next(iter(jids)))
        body_runs += len(notes)
        assert all(n["results"] == [i * i for i in range(HEADER)] for n in notes), notes
        members = {n["tag"][1] for n in cog.notes() if n["tag"][0] == "square" and n.get("bid") == bid}
        assert members == set(range(HEADER)), f"chord {tag}: header members that ran: {sorted(members)}"
        seen = batch_jobs.figures(bid)
        assert (seen["total"], seen["succeeded"], seen["pending"], seen["dead"]) == (HEADER, HEADER, 0, 0)

    lost, second_runs = report(
        chaos,
        f"chains and chords, {how}",
        f", {len(chains)} chains of {STEPS} steps ({len(batched) * CHAINS_IN_A_BATCH} in {len(batched)} "
        f"batches; {step_reruns} steps started again after a hit), {len(chords)} chords of {HEADER} "
        f"(bodies: {len(chords)} enqueued, {body_runs} runs)"
        + (f", {stopper.stops} stops" if stopper.stops else ""),
    )
    assert not lost
    assert second_runs <= (chaos.hits if how == "sigkill" else stopper.stops) * CONCURRENCY
    assert chaos.held_at_hits > 0, "no hit caught a worker holding jobs: the test proved nothing"
    assert step_reruns > 0, "no step was caught running by a hit: the test proved nothing"
    assert process_died(cog) == []
    shut_down(cog, chaos.workers)
