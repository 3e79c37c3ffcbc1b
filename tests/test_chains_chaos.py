"""G22 for chains and chords (SPEC section 13) under SIGKILL chaos: real
worker processes SIGKILLed at random (``tests/test_batches_chaos.py``'s
``hit_every_tick``) while chains of short steps and chords of fifty header
members stream through them.

Each step runs at least once, after the previous one succeeded, with the
previous step's result; each step is enqueued once (one jid per step: the
ack that pushes the next one is the script that records the end of the
current one); a chord's body is enqueued once, with every header result in
header order. ``-s`` prints the figures; ``COGWORKER_CHAOS_SEED`` replays.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django_cogworker import chain, chord, group
from testproject.testapp import batch_jobs
from tests.conftest import CogEnv
from tests.test_batches_chaos import CONCURRENCY, hit_every_tick
from tests.test_chaos import held_when_killed, process_died, report, shut_down
from tests.test_guarantees import leftovers

CHAINS_PER_TICK = 12
STEPS = 5
STEP_S = 0.1
HEADER = 50
HEADER_S = 0.05


def by_step(notes: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for note in notes:
        if isinstance(note["tag"], list) and isinstance(note["tag"][0], str) and note["tag"][0] != "square":
            found[(note["tag"][0], note["tag"][1])].append(note)
    return found


def test_g22_chains_and_chords_under_sigkill_chaos_each_step_and_body_enqueued_once(cog: CogEnv) -> None:
    chains: list[str] = []
    chords: dict[str, str] = {}  # body tag -> the chord's bid

    def each_tick(tick: int) -> list[str]:
        firsts = []
        for c in range(CHAINS_PER_TICK):
            chain_id = f"c{tick}-{c}"
            steps = [batch_jobs.link.s(chain_id, i, STEP_S) for i in range(STEPS)]
            firsts.append(str(chain(*steps).delay()))
            chains.append(chain_id)
        if tick % 2 == 0:
            tag = f"chord-{tick}"
            header = group(batch_jobs.square.s(i, HEADER_S) for i in range(HEADER))
            chords[tag] = str(chord(header, batch_jobs.gather.s(tag=tag)).delay())
        return firsts

    def done() -> bool:
        ran = by_step(cog.notes())
        bodies = {n["tag"] for n in cog.notes("bodies")}
        return all(ran.get((c, STEPS - 1)) for c in chains) and set(chords) <= bodies and leftovers(cog) == {}

    chaos = hit_every_tick(cog, each_tick, done)

    runs, started = by_step(cog.notes()), by_step(cog.notes("started"))
    step_reruns = 0
    for chain_id in chains:
        for i in range(STEPS):
            notes = runs[(chain_id, i)]
            starts = started[(chain_id, i)]
            jids = {n["jid"] for n in notes + starts}
            assert len(jids) == 1, f"step {i} of {chain_id} enqueued {len(jids)} times: {sorted(jids)}"
            [jid] = jids
            assert all(n["so_far"] == (list(range(i)) if i else None) for n in notes + starts), notes
            assert len(starts) <= 1 + held_when_killed(chaos, jid)[0], f"{jid} started {len(starts)} times"
            step_reruns += len(starts) - 1
            if i:
                # Started only after the previous step ended (its note comes before its ack).
                previous_end = min(n["at"] for n in runs[(chain_id, i - 1)])
                assert min(n["at"] for n in started[(chain_id, i)]) >= previous_end, (chain_id, i)

    bodies = cog.notes("bodies")
    body_runs = 0
    for tag, bid in chords.items():
        notes = [n for n in bodies if n["tag"] == tag]
        jids = {n["jid"] for n in notes}
        assert len(jids) == 1, f"the body of {tag} enqueued {len(jids)} times"
        assert len(notes) <= 1 + held_when_killed(chaos, next(iter(jids)))[0]
        body_runs += len(notes)
        assert all(n["results"] == [i * i for i in range(HEADER)] for n in notes), notes
        members = {
            n["tag"][1]
            for n in cog.notes()
            if isinstance(n["tag"], list) and n["tag"][0] == "square" and n.get("bid") == bid
        }
        assert members == set(range(HEADER)), f"chord {tag}: header members that ran: {sorted(members)}"
        seen = batch_jobs.figures(bid)
        assert (seen["total"], seen["succeeded"], seen["pending"], seen["dead"]) == (HEADER, HEADER, 0, 0), (
            seen
        )

    lost, second_runs = report(
        chaos,
        "chains and chords, SIGKILL",
        f", {len(chains)} chains of {STEPS} steps ({step_reruns} steps started again after a kill), "
        f"{len(chords)} chords of {HEADER} (bodies: {len(chords)} enqueued, {body_runs} runs)",
    )
    assert not lost
    assert second_runs <= chaos.hits * CONCURRENCY
    assert chaos.held_at_hits > 0, "no kill caught a worker holding jobs: the test proved nothing"
    assert process_died(cog) == []
    shut_down(cog, chaos.workers)
