"""Orphan recovery, settlement and strays: what keeps every job alive.

Duties:
- recover the in-progress lists of dead processes (G2, G4, G5): a list is
  requeued only if its owner's presence key is gone AND ``ORPHAN_THRESHOLD``
  has passed since its last beat on Redis's clock, decided inside the same
  Lua call as the requeue (``requeue.lua``);
- park poison pills and file them in dead as ``ProcessDied`` (G3);
- settle this process's finished jobs whose ack or filing failed, and
  requeue strays seen twice (G6, G7);
- at shutdown, put this process's unfinished jobs back, drop the finished
  ones and hand unfileable failures to ``N:unsettled`` (G8), which any live
  process files;
- never let one broken identity or key stop the others (G12).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from django_cogworker import registry
from django_cogworker.errors import ProcessDied
from django_cogworker.heartbeat import DAILY_STATS_TTL_S
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode, salvage
from django_cogworker.scripts import script

if TYPE_CHECKING:
    from django_cogworker.manager import Manager

logger = logging.getLogger("django_cogworker")

ORPHANINGS_TTL_S = 7 * 24 * 3600
#: A stray is requeued when seen on two looks in a row at least this far
#: apart: between a fetch returning and its thread recording the job as
#: running there are microseconds, but a loaded machine can stall a thread
#: for longer than a (short, test-sized) heartbeat interval.
STRAY_MIN_AGE_S = 2.0
T = TypeVar("T")


class Recovery:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.client = manager.client
        self.keys: Keys = manager.keys
        self.config = manager.config
        # Stray candidates -> when first seen (monotonic clock).
        self.previous_strays: dict[bytes, float] = {}
        # Lists found by the boot scan but not in the registry, looked at
        # again on every pass until their owner is found dead: at boot it may
        # be too early to tell (see requeue.lua, the stall check).
        self.scanned: set[str] = set()
        self.last_report: dict[str, Any] = {}

    # -- requeue ---------------------------------------------------------------

    def requeue_in_progress(
        self,
        identity: str,
        *,
        if_dead_for_s: float | None = None,
        finished: Iterable[bytes] = (),
        keep: Iterable[bytes] = (),
    ) -> int:
        """Puts ``identity``'s in-progress jobs back on their queues; returns
        how many, or -1 if ``if_dead_for_s`` is given and the owner is alive."""
        k = self.keys
        args: list[Any] = [
            *self.manager.requeue_args(),
            identity,
            "" if if_dead_for_s is None else repr(if_dead_for_s),
            repr(time.time()),
            k.orphanings_prefix,
            ORPHANINGS_TTL_S,
            self.config.max_orphanings,
            repr(self.config.heartbeat_ttl_s),
            *(b"d:" + raw for raw in finished),
            *(b"k:" + raw for raw in keep),
        ]
        reply = script("requeue")(
            self.client,
            [k.inprogress(identity), k.process(identity), k.last_beat, k.repeat_orphans, k.dead, k.beats],
            args,
        )
        moved, buried = int(reply[0]), reply[1:]
        self.complete_raw_burials(buried)
        return moved

    def recover_orphans(self, *, scan: bool = False) -> dict[str, Any]:
        """One pass over every registered identity but our own. Returns (and
        keeps) a report of what it found."""
        report: dict[str, Any] = {
            "at": time.time(),
            "identity": self.manager.identity,
            "checked": 0,
            "requeued": 0,
            "parked": 0,
            "registry": False,
            "scan": None,
            "errors": 0,
        }
        for identity in self.candidate_identities(scan=scan, report=report):
            if identity == self.manager.identity:
                continue
            report["checked"] += 1
            try:
                report["requeued"] += self.recover_identity(identity)
            except Exception as exc:
                report["errors"] += 1
                if self.manager.outage.failed(exc):
                    report["connection_lost"] = True
                    break  # the others would fail the same way
                logger.error("orphan recovery skipped %s: %s: %s", identity, type(exc).__name__, exc)
        report["parked"] = self.isolated("burying repeat orphans", 0, report, self.bury_repeat_orphans)
        self.isolated("filing unsettled jobs", 0, report, self.file_unsettled)
        self.last_report = report
        self.isolated("saving the recovery report", None, report, lambda: self.save_report(report))
        if report.get("connection_lost"):
            pass  # the outage is logged once, by the process
        elif report["requeued"] or report["parked"] or report["errors"]:
            logger.warning("%s", describe(report))
        else:
            logger.info("%s", describe(report))
        return report

    def save_report(self, report: dict[str, Any]) -> None:
        self.client.set(self.keys.recovery_report, json.dumps(report), ex=7 * 24 * 3600)

    def recover_identity(self, identity: str) -> int:
        moved = self.requeue_in_progress(identity, if_dead_for_s=self.config.orphan_threshold_s)
        if moved < 0:
            return 0  # alive after all: it keeps its registration and its jobs
        self.scanned.discard(identity)
        self.isolated(f"forgetting {identity}", None, None, lambda: self.forget_if_empty(identity))
        if moved:
            logger.warning("requeued %d job(s) left in progress by dead process %s", moved, identity)
        return moved

    def forget_if_empty(self, identity: str) -> None:
        k = self.keys
        if self.client.llen(k.inprogress(identity)) == 0:
            pipe = self.client.pipeline(transaction=False)
            pipe.srem(k.inprogress_identities, identity)
            pipe.hdel(k.last_beat, identity)
            pipe.srem(k.processes, identity)
            pipe.delete(k.workers(identity))
            pipe.execute()

    def candidate_identities(self, *, scan: bool, report: dict[str, Any]) -> list[str]:
        # Each source on its own: an unreadable registry must not also lose
        # the one-off scan, and vice versa.
        registered = self.isolated(
            "reading the in-progress registry",
            None,
            report,
            lambda: [m.decode() for m in self.client.smembers(self.keys.inprogress_identities)],
        )
        report["registry"] = registered is not None
        found = list(registered or [])
        if scan:
            prefix = self.keys.inprogress_prefix
            scanned = self.isolated(
                "scanning for in-progress lists",
                None,
                report,
                lambda: [
                    key.decode().removeprefix(prefix)
                    for key in self.client.scan_iter(match=_glob_escape(prefix) + "*", count=1000)
                ],
            )
            report["scan"] = scanned is not None
            self.scanned.update(i for i in scanned or [] if i not in found)
        found += sorted(i for i in self.scanned if i not in found)
        return found

    # -- poison pills (G3) -----------------------------------------------------

    def bury_repeat_orphans(self) -> int:
        buried = 0
        for raw in self.client.lrange(self.keys.repeat_orphans, 0, -1):
            entry = {**salvage(raw), **self.repeat_orphan_error()}
            moved = script("bury_orphan")(
                self.client,
                [self.keys.repeat_orphans, self.keys.dead],
                [raw, repr(time.time()), encode(entry)],
            )
            if moved == 1:
                buried += 1
                logger.error("jid=%s orphaned too often; moved to dead", entry.get("jid"))
                self.buried_as_dead(entry)
        return buried

    def complete_raw_burials(self, raws: list[bytes]) -> None:
        """Jobs requeue.lua filed in dead raw (its parking list unusable):
        swapped for a proper dead entry. Best effort, per job."""
        for raw in raws:
            try:
                entry = {**salvage(raw), **self.repeat_orphan_error()}
                pipe = self.client.pipeline(transaction=False)
                pipe.zadd(self.keys.dead, {encode(entry): time.time()})
                pipe.zrem(self.keys.dead, raw)
                pipe.execute()
                self.buried_as_dead(entry)
            except Exception as exc:
                logger.error("completing the dead entry of a repeat orphan failed: %s", exc)

    def repeat_orphan_error(self) -> Payload:
        return {
            "error_class": "ProcessDied",
            "error_message": (
                f"its worker process died while running it more than {self.config.max_orphanings} times "
                "(killed for using too much memory by the OOM killer? SIGKILL? a crash?); not retried again"
            ),
            "failed_at": time.time(),
        }

    def buried_as_dead(self, entry: Payload) -> None:
        """What any terminal failure does: counted as failed, its locks
        released, its orphan counter gone. Best effort."""
        try:
            from django_cogworker import locks

            pipe = self.client.pipeline(transaction=False)
            pipe.incr(self.keys.stat_failed)
            day_key = self.keys.stat_failed_on(time.strftime("%Y-%m-%d", time.gmtime()))
            pipe.incr(day_key)
            pipe.expire(day_key, DAILY_STATS_TTL_S)
            pipe.delete(self.keys.orphanings(str(entry.get("jid", ""))))
            pipe.execute()
            locks.release_all(self.client, self.keys, entry)
        except Exception as exc:
            logger.error("after burying jid=%s: %s", entry.get("jid"), exc)
        # Its last chance is gone too: the job's on_exhausted hears of it (a
        # Django Tasks result becomes FAILED this way).
        job = registry.get(str(entry.get("job", "")))
        if job is not None and job.on_exhausted is not None:
            try:
                job.on_exhausted(entry, ProcessDied(str(entry.get("error_message", ""))))
            except Exception:
                logger.exception("on_exhausted of job %s failed", entry.get("job"))

    # -- settlement and strays (G6, G7) ---------------------------------------

    def reconcile(self) -> None:
        """Settles what can be settled now and requeues strays seen twice.

        A stray is an entry of our own list that no thread runs, judged from
        the manager's memory, never from ``N:workers`` (a failover can lose
        that while a long job still runs). The second look, at least
        STRAY_MIN_AGE_S after the first, rules out a job caught between being
        fetched and being recorded as running."""
        manager = self.manager
        if not manager.reliable:
            return
        key = self.keys.inprogress(manager.identity)
        listed = self.client.lrange(key, 0, -1)
        running = manager.running_counter()
        _, pending = manager.snapshot()
        strays = []
        for raw in listed:
            if running[raw] > 0:
                running[raw] -= 1
            elif raw in pending:
                self.settle_one(raw, pending[raw])
            else:
                strays.append(raw)
        now = time.monotonic()
        for raw in strays:
            first_seen = self.previous_strays.get(raw)
            if first_seen is None or now - first_seen < STRAY_MIN_AGE_S:
                continue
            if manager.running_counter()[raw] or raw in manager.snapshot()[1]:
                continue
            moved = script("requeue_one")(self.client, [key], [raw, *manager.requeue_args()])
            if moved == 1:
                logger.warning("requeued stray in-progress job jid=%s", salvage(raw).get("jid"))
        self.previous_strays = {raw: self.previous_strays.get(raw, now) for raw in strays}
        # A pending settlement whose job is no longer listed (a recovery took
        # it, or it was settled) has nothing left to do.
        listed_set = set(listed)
        for raw in pending:
            if raw not in listed_set:
                manager.forget_pending(raw)

    def settle_one(self, raw: bytes, how: Any) -> None:
        from django_cogworker.fetch import UnitOfWork

        try:
            self.manager.apply(UnitOfWork("", raw), how)
        except Exception as exc:
            if not self.manager.outage.failed(exc):
                logger.error("still could not settle jid=%s: %s", salvage(raw).get("jid"), exc)
            return
        self.manager.forget_pending(raw)

    def settle_unfinished(self, manager: Manager) -> None:
        """The shutdown step (G8), after the wait and the interrupts."""
        if not manager.reliable:
            return
        _, pending = manager.snapshot()
        for raw, how in list(pending.items()):
            self.settle_one(raw, how)
        _, pending = manager.snapshot()
        acks = [raw for raw, how in pending.items() if how == "ack"]
        filings = {raw: how for raw, how in pending.items() if how != "ack"}
        try:
            moved = self.requeue_in_progress(manager.identity, finished=acks, keep=list(filings))
            if moved:
                logger.warning("requeued %d unfinished job(s) at shutdown", moved)
        except Exception as exc:
            logger.error("could not requeue unfinished jobs at shutdown (%s); recovery will find them", exc)
            return
        self.park_unsettled(filings)

    def park_unsettled(self, filings: dict[bytes, Any]) -> None:
        key = self.keys.inprogress(self.manager.identity)
        for raw, (zset, score, payload, _jid, _trim) in filings.items():
            record = json.dumps({"set": zset, "score": score, "payload": payload.decode("utf-8", "replace")})
            try:
                script("park_unsettled")(self.client, [key, self.keys.unsettled], [raw, record])
            except Exception as exc:
                logger.error("could not hand over unsettled jid=%s: %s", salvage(raw).get("jid"), exc)

    def file_unsettled(self) -> int:
        """Files what shutting-down processes handed over, head first,
        stopping at the first that cannot be filed (tried again next pass)."""
        filed = 0
        allowed = {self.keys.retry, self.keys.dead, self.keys.schedule}
        for record in self.client.lrange(self.keys.unsettled, 0, -1):
            try:
                entry = json.loads(record)
                zset, score, payload = entry["set"], float(entry["score"]), entry["payload"]
                if zset not in allowed:
                    raise ValueError(f"unknown set {zset!r}")
            except Exception:
                logger.error("dropping an unreadable unsettled record: %r", record[:200])
                self.client.lrem(self.keys.unsettled, 1, record)
                continue
            if (
                script("file_unsettled")(
                    self.client, [self.keys.unsettled, zset], [record, repr(score), payload]
                )
                != 1
            ):
                break
            filed += 1
        return filed

    # -- helpers ---------------------------------------------------------------

    def isolated(self, what: str, fallback: T, report: dict[str, Any] | None, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:
            outage = self.manager.outage.failed(exc)
            if report is not None:
                report["errors"] = report.get("errors", 0) + 1
                if outage:
                    report["connection_lost"] = True
            if not outage:
                logger.error("orphan recovery: %s failed: %s: %s", what, type(exc).__name__, exc)
            return fallback


def describe(report: dict[str, Any]) -> str:
    """The recovery report as a sentence for the log."""

    def count(n: int, one: str, many: str) -> str:
        return f"{n} {one if n == 1 else many}"

    text = (
        f"orphan recovery: checked {count(report['checked'], 'other process', 'other processes')}, "
        f"requeued {count(report['requeued'], 'job', 'jobs')}, "
        f"parked {count(report['parked'], 'repeat orphan', 'repeat orphans')}"
    )
    if report["scan"] is not None:
        text += ", with a key scan" if report["scan"] else ", the key scan failed"
    if report["errors"]:
        text += f"; {count(report['errors'], 'step', 'steps')} failed (logged above)"
    return text


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
