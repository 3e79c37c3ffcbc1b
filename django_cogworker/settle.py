"""Settling jobs: telling Redis how each job of this process ended.

Duties:
- record each job's end, in one place (``Settler.finished``): its ack owed
  to the next fetch (``acks.Acks``), or the outcome applied now;
- apply an outcome: acknowledge a finished job, or file a failed one in
  retry or dead; when that fails, keep it in the ledger to settle later,
  never to run again (G6);
- every beat, settle what is owed and requeue strays: entries of this
  process's list that no thread runs, judged from the ledger, never from
  Redis, when seen twice in a row (G7);
- at shutdown, put back this process's unfinished jobs, drop the finished
  ones and hand failures that could not be filed to ``N:unsettled`` (G8);
- file what shutting-down processes handed to ``N:unsettled``.
"""

from __future__ import annotations

import json
import logging
import time

from django_cogworker import execution
from django_cogworker.execution import Outcome
from django_cogworker.fetch import FetchContext
from django_cogworker.fetch_mode import Fetching
from django_cogworker.filing import file_job
from django_cogworker.ledger import ACK, Ack, Filing, Pending
from django_cogworker.limits import state
from django_cogworker.limits.limiter import Limiter
from django_cogworker.limits.running import Waker
from django_cogworker.outage import Outage
from django_cogworker.payload import salvage
from django_cogworker.requeue import requeue_list, requeue_one
from django_cogworker.scripts import script
from django_cogworker.work import UnitOfWork
from django_cogworker.workflows import effects, forward
from django_cogworker.workflows.ends import settle_flow, workflow_of

logger = logging.getLogger("django_cogworker")

#: A stray is requeued when seen on two looks in a row at least this far
#: apart: between a fetch returning and its thread recording the job as
#: running there are microseconds, but a loaded machine can stall a thread
#: for longer than a (short, test-sized) heartbeat interval.
STRAY_MIN_AGE_S = 2.0


class Settler:
    def __init__(
        self, ctx: FetchContext, fetching: Fetching, outage: Outage, waker: Waker | None = None
    ) -> None:
        self.ctx = ctx
        #: Wakes limiters' waiters that a release made room for on other queues.
        self.waker = waker or Waker(ctx.client, ctx.keys, ctx.quiet)
        #: Jobs holding limiter slots whose settlement is owed: settled with
        #: their release, later (G6).
        self.unreleased: dict[bytes, UnitOfWork] = {}
        self.fetching = fetching
        self.outage = outage
        self.ledger = ctx.ledger
        self.acks = fetching.acks
        self.inprogress = ctx.keys.inprogress(ctx.identity)
        # Stray candidates -> when first seen (monotonic clock).
        self.previous_strays: dict[bytes, float] = {}

    # -- one job -----------------------------------------------------------------

    def finished(self, index: int, work: UnitOfWork, outcome: Outcome, owed: bool | None = None) -> None:
        """The one place a job's end is recorded, once per job, by the
        thread ``index`` that ran it: its ack owed to the next fetch, or its
        outcome applied now; then the thread's slot is free. Effects of a
        completion (SPEC sections 13-14: a batch's membership, a limiter's
        release) belong here. ``owed``: :meth:`in_memory`'s verdict, when
        the caller has already asked it."""
        if owed is None:
            owed = self.in_memory(work, outcome)
        if owed:
            self.acks.owe(work, outcome.jid)
        elif outcome.kind == execution.WAIT:
            self.wait(work, outcome.waits_for)
        else:
            if outcome.workflow is not None:
                work.result = outcome.result
                work.lost = outcome.kind == execution.ACK and outcome.failed is True and not outcome.expired
            self.settle(work, outcome)
        self.ledger.finished(index, work, outcome.failed, outcome.ran)

    def in_memory(self, work: UnitOfWork, outcome: Outcome) -> bool:
        """Whether :meth:`finished` records this end in memory alone (its ack
        owed to the next fetch): the event loop of async jobs then calls it
        itself, else from a thread, as it may wait on Redis."""
        # A recovered job is acknowledged at once, with its orphan counter:
        # left owed, a kill before the next fetch would count it as orphaned
        # again though it had finished (G19). A job holding a limiter's slot
        # too: its release rides the call that settles it, now (SPEC 14). A
        # workflow's job too: its effects ride its ack (SPEC 13).
        return (
            outcome.kind == execution.ACK
            and self.fetching.reliable
            and not work.recovered
            and not work.holds
            and outcome.workflow is None
        )

    def settle(self, work: UnitOfWork, outcome: Outcome) -> None:
        """Tells Redis how the job ended; on failure keeps it owed (G6)."""
        if self.ledger.was_interrupted(work.raw):
            return  # filed in retry by the shutdown already
        how: Pending = ACK
        if outcome.kind != execution.ACK:
            k = self.ctx.keys
            zset = k.retry if outcome.kind == execution.RETRY else k.dead
            how = Filing(zset, outcome.score, outcome.encoded(), outcome.jid, outcome.kind == execution.DEAD)
        try:
            self.apply(work, how)
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error(
                    "could not settle jid=%s yet (%s: %s); will retry", outcome.jid, type(exc).__name__, exc
                )
            self.ledger.owe(work.raw, how)
            if work.holds or outcome.workflow is not None:
                self.unreleased[work.raw] = work

    def wait(self, work: UnitOfWork, limiter: Limiter) -> None:
        """A job whose code met a full limiter (``acquire()``): its slots
        freed, it is parked to run again from its start. Left on our list
        when Redis cannot take it: the stray check requeues it (G7)."""
        ctx = self.ctx
        try:
            if work.holds:
                state.release(ctx.client, ctx.keys, ctx.identity, work.jid, work.queue, work.holds)
            wait_s = state.park(
                ctx.client,
                ctx.keys,
                self.inprogress,
                work.raw,
                work.jid,
                work.queue,
                limiter,
                self.fetching.reliable,
            )
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error(
                    "could not park jid=%s for limiter %s (%s); it is requeued", work.jid, limiter.name, exc
                )
            return
        logger.debug("jid=%s waits for limiter %s", work.jid, limiter.name)
        if wait_s:
            self.waker.at(limiter, wait_s)

    def flush_acks(self) -> None:
        """Sends now the acks no fetch of a stopping thread will carry; one
        that fails stays owed, for reconcile or the shutdown (G6)."""
        if not self.acks:
            return  # the usual case; and a fetcher not chosen yet is not asked for
        try:
            self.acks.flush(self.fetching.current().ack)
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error("could not acknowledge finished jobs yet (%s); will retry", exc)

    def apply(self, work: UnitOfWork, how: Pending) -> None:
        flow, ctx = workflow_of(work), self.ctx
        if work.holds:
            if flow is None and not ctx.keys.sharded:
                self.apply_releasing(work, how)
                return
            # Released first, then settled (with the workflow's effects; in
            # another slot than the limiters under SHARDING): a crash
            # between leaves the job on our list, run again.
            state.release(ctx.client, ctx.keys, ctx.identity, work.jid, work.queue, work.holds)
            work.holds = ()
        if flow is not None:
            listed = self.inprogress if self.fetching.reliable else None
            settle_flow(ctx.client, ctx.keys, ctx.config, listed, work, how, flow)
            self.unreleased.pop(work.raw, None)
            return
        fetcher = self.fetching.current()
        if isinstance(how, Ack):
            fetcher.ack(work, work.jid)
        else:
            fetcher.file(work, how.zset, how.score, how.payload, how.jid, how.trim)

    def apply_releasing(self, work: UnitOfWork, how: Pending) -> None:
        """Settles a job holding limiter slots and frees them in the same
        call (``ack.lua``/``file.lua`` with ``release_slots``); only where
        this process still holds them (G18). Under basic fetch there is no
        list for those calls to take the job off: released on its own."""
        ctx, jid = self.ctx, work.jid
        if not self.fetching.reliable:
            elsewhere = state.release(ctx.client, ctx.keys, ctx.identity, jid, work.queue, work.holds)
            if isinstance(how, Filing):
                self.fetching.current().file(work, how.zset, how.score, how.payload, how.jid, how.trim)
        else:
            extra = state.release_args(ctx.keys, ctx.identity, jid, work.queue, work.holds)
            if isinstance(how, Ack):
                keys = [self.inprogress, ctx.keys.orphanings(jid), *extra[0]]
                reply = script("ack")(ctx.client, keys, [work.raw, *extra[1]])
            else:
                reply = file_job(
                    ctx.client,
                    ctx.keys,
                    ctx.config,
                    self.inprogress,
                    work.raw,
                    how.zset,
                    how.score,
                    how.payload,
                    how.jid,
                    how.trim,
                    extra=extra,
                )
            elsewhere = int(reply[1]) if isinstance(reply, list) else 0
        self.unreleased.pop(work.raw, None)
        for limiter in work.holds if elsewhere else ():
            self.waker.now(limiter)

    def give_back(self, work: UnitOfWork, *, held: bool = True) -> None:
        """A fetched job that will not run here goes back to its queue
        (``held``: not started, so still counted as held in the ledger)."""
        if held:
            self.ledger.unhold(work)
        try:
            self.fetching.current().give_back(work)
        except Exception:
            # Still on our list: the shutdown requeue (or a stray check) puts it back.
            logger.exception("could not give back a fetched job; it stays in progress")

    def settle_owed(self, raw: bytes, how: Pending) -> None:
        try:
            self.apply(self.unreleased.get(raw) or UnitOfWork("", raw), how)
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error("still could not settle jid=%s: %s", salvage(raw).get("jid"), exc)
            return
        self.ledger.settled(raw)

    # -- every beat (G6, G7) -------------------------------------------------------

    def reconcile(self) -> None:
        """Settles what can be settled now and requeues strays seen twice.

        A stray is an entry of our own list that no thread runs, judged from
        the ledger, never from ``N:workers`` (a failover can lose that while
        a long job still runs). The second look, at least STRAY_MIN_AGE_S
        after the first, rules out a job caught between being fetched and
        being recorded as running."""
        if not self.fetching.reliable:
            return
        client, ledger = self.ctx.client, self.ledger
        listed = client.lrange(self.inprogress, 0, -1)
        running = ledger.running_counter()
        owed = ledger.owed()
        strays = []
        for raw in listed:
            if running[raw] > 0:
                running[raw] -= 1
            elif raw in owed:
                self.settle_owed(raw, owed[raw])
            else:
                strays.append(raw)
        now = time.monotonic()
        for raw in strays:
            first_seen = self.previous_strays.get(raw)
            if first_seen is None or now - first_seen < STRAY_MIN_AGE_S:
                continue
            if ledger.running_counter()[raw] or raw in ledger.owed():
                continue
            if requeue_one(client, self.ctx.keys, self.inprogress, raw):
                logger.warning("requeued stray in-progress job jid=%s", salvage(raw).get("jid"))
        self.previous_strays = {raw: self.previous_strays.get(raw, now) for raw in strays}
        # An owed settlement whose job is no longer listed (a recovery took
        # it, or it was settled) has nothing left to do.
        listed_set = set(listed)
        for raw in owed:
            if raw not in listed_set:
                ledger.settled(raw)

    # -- shutdown (G8) ---------------------------------------------------------------

    def settle_unfinished(self) -> None:
        """The shutdown step, after the wait and the interrupts."""
        if not self.fetching.reliable:
            return
        for raw, how in self.ledger.owed().items():
            self.settle_owed(raw, how)
        owed = self.ledger.owed()
        # A workflow's job whose end could not be sent is put back, to run
        # again: dropped as finished, its batch would wait for it forever.
        acks = [
            raw
            for raw, how in owed.items()
            if isinstance(how, Ack) and workflow_of(self.unreleased.get(raw) or UnitOfWork("", raw)) is None
        ]
        filings = {raw: how for raw, how in owed.items() if isinstance(how, Filing)}
        ctx = self.ctx
        try:
            moved, _ = requeue_list(
                ctx.client, ctx.keys, ctx.config, ctx.identity, finished=acks, keep=list(filings)
            )
            if moved:
                logger.warning("requeued %d unfinished job(s) at shutdown", moved)
        except Exception as exc:
            logger.error("could not requeue unfinished jobs at shutdown (%s); recovery will find them", exc)
            return
        self.park_unsettled(filings)

    def park_unsettled(self, filings: dict[bytes, Filing]) -> None:
        for raw, how in filings.items():
            record = json.dumps(
                {"set": how.zset, "score": how.score, "payload": how.payload.decode("utf-8", "replace")}
            )
            keys = [self.inprogress, self.ctx.keys.unsettled]
            try:
                script("park_unsettled")(self.ctx.client, keys, [raw, record])
            except Exception as exc:
                logger.error("could not hand over unsettled jid=%s: %s", salvage(raw).get("jid"), exc)


def file_unsettled(ctx: FetchContext) -> int:
    """Files what shutting-down processes handed over, head first,
    stopping at the first that cannot be filed (tried again next pass)."""
    client, k = ctx.client, ctx.keys
    filed = 0
    allowed = {k.retry, k.dead, k.schedule}
    for record in client.lrange(k.unsettled, 0, -1):
        try:
            entry = json.loads(record)
            zset, score, payload = entry["set"], float(entry["score"]), entry["payload"]
            if zset not in allowed:
                raise ValueError(f"unknown set {zset!r}")
        except Exception:
            logger.error("dropping an unreadable unsettled record: %r", record[:200])
            client.lrem(k.unsettled, 1, record)
            continue
        extra = effects.filed(k, ctx.config, zset, salvage(payload))
        if (
            script("file_head")(
                client, [k.unsettled, zset, *extra[0]], [record, repr(score), payload, *extra[1]]
            )
            != 1
        ):
            break
        filed += 1
    if filed:
        forward.soon(client, k, ctx.config)  # members' moves, from the outbox to their batches
    return filed
