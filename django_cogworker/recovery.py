"""Orphan recovery and poison pills: what brings a dead process's jobs back.

Duties:
- recover the in-progress lists of dead processes (G2, G4, G5): a list is
  requeued only if its owner's presence key is gone AND ``ORPHAN_THRESHOLD``
  has passed since its last beat on Redis's clock, with no silence of every
  process under way (a Redis stall), decided inside the same Lua call as
  the requeue (``requeue.lua``, through ``requeue.py``);
- find those lists through the registry, and at boot with a key scan, whose
  finds are looked at again until their owner is found dead;
- park poison pills and file them in dead as ``ProcessDied`` (G3);
- never let one broken identity or key stop the others (G12).

Settling this process's own jobs, strays and the shutdown are the
settler's (``settle.py``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django_cogworker import registry, stats
from django_cogworker.errors import ProcessDied
from django_cogworker.fetch import BLOCKING_TIMEOUT_S
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode_stored, salvage
from django_cogworker.process import ProcessContext
from django_cogworker.requeue import ORPHANINGS_TTL_S, requeue_list
from django_cogworker.scripts import script
from django_cogworker.workflows import effects, forward

logger = logging.getLogger("django_cogworker")

__all__ = ["ORPHANINGS_TTL_S", "Recovery"]

T = TypeVar("T")

#: Slack for the round trips and clocks in ``Recovery.forget_if_empty``.
FORGET_MARGIN_S = 1.0

#: How long a forgotten process is still looked for (``Recovery.remember_refilled``).
FORGOTTEN_KEEP_S = 3600.0


class Recovery:
    def __init__(self, process: ProcessContext) -> None:
        self.process = process
        self.client = process.client
        self.keys: Keys = process.keys
        self.config = process.config
        self.outage = process.outage
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
        moved, buried = requeue_list(
            self.client,
            self.keys,
            self.config,
            identity,
            if_dead_for_s=if_dead_for_s,
            finished=finished,
            keep=keep,
            stall_gap_s=self.config.heartbeat_ttl_s,
        )
        self.complete_raw_burials(buried)
        return moved

    def recover_orphans(self, *, scan: bool = False) -> dict[str, Any]:
        """One pass over every registered identity but our own. Returns (and
        keeps) a report of what it found."""
        report: dict[str, Any] = {
            "at": time.time(),
            "identity": self.process.identity,
            "checked": 0,
            "requeued": 0,
            "parked": 0,
            "registry": False,
            "scan": None,
            "errors": 0,
        }
        for identity in self.candidate_identities(scan=scan, report=report):
            if identity == self.process.identity:
                continue
            report["checked"] += 1
            try:
                report["requeued"] += self.recover_identity(identity)
            except Exception as exc:
                report["errors"] += 1
                if self.outage.failed(exc):
                    report["connection_lost"] = True
                    break  # the others would fail the same way
                logger.error("orphan recovery skipped %s: %s: %s", identity, type(exc).__name__, exc)
        report["parked"] = self.isolated("burying repeat orphans", 0, report, self.bury_repeat_orphans)
        self.last_report = report
        self.isolated("saving the recovery report", None, report, lambda: self.save_report(report))
        if report.get("connection_lost"):
            pass  # the outage is logged once, by the process
        elif report["requeued"] or report["parked"] or report["errors"]:
            logger.warning("%s", describe(report))
        else:
            logger.debug("%s", describe(report))  # nothing found: every minute at INFO was noise
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
        """Forgets a recovered identity once its list is empty and no fetch
        of its owner can fill it any more: a process sends none later than
        ``HEARTBEAT_TTL`` after its last beat (``process.Registration``),
        and a blocking one sent then waits ``BLOCKING_TIMEOUT_S`` at most on
        the server. Until then the identity stays registered, and a job that
        such a late fetch moves into its list is recovered on a later pass
        (G18), not left where no recovery looks. Decided in ``forget.lua``,
        atomically with a beat that may have come meanwhile."""
        k = self.keys
        span_s = self.config.heartbeat_ttl_s + BLOCKING_TIMEOUT_S + FORGET_MARGIN_S
        keys = [
            k.inprogress(identity),
            k.process(identity),
            k.last_beat,
            k.inprogress_identities,
            k.forgotten,
        ]
        if not k.sharded:
            keys += [k.processes, k.workers(identity)]
        forgotten = script("forget")(self.client, keys, [identity, span_s])
        if forgotten and k.sharded:
            # The shared records, in the {N} slot: one key per command.
            s = k.shared
            pipe = self.client.pipeline(transaction=False)
            pipe.srem(s.processes, identity)
            for key in (s.workers(identity), s.process(identity)):
                pipe.delete(key)
            pipe.srem(s.inprogress_identities, identity)
            pipe.hdel(s.last_beat, identity)
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
        if registered is not None:
            self.isolated("looking at forgotten processes", 0, report, lambda: self.remember_refilled(found))
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

    def remember_refilled(self, registered: list[str]) -> int:
        """G18: registers again a forgotten process whose list holds jobs
        again; returns how many. Only its own fetch fills it: one decided
        before a stop and sent in the moment after it resumed, before the
        beat that would have registered it; stopped or killed again right
        after, it would hold that job where no recovery looks. Registered
        again with a fresh stamp (``remember.lua``), the list is recovered
        on a later pass once its owner has stayed silent for
        ``ORPHAN_THRESHOLD``. Forgotten processes are looked for during
        ``FORGOTTEN_KEEP_S``; after that, the next worker's boot scan finds
        such a list."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zremrangebyscore(k.forgotten, "-inf", time.time() - FORGOTTEN_KEEP_S)
        pipe.zrange(k.forgotten, 0, -1)
        forgotten = [m.decode() for m in pipe.execute()[1]]
        if not forgotten:
            return 0
        beat_again = [i for i in forgotten if i in registered]
        # Not this process's own: alive, it registers again with its beat.
        others = [i for i in forgotten if i not in registered and i != self.process.identity]
        pipe = self.client.pipeline(transaction=False)
        if beat_again:
            pipe.zrem(k.forgotten, *beat_again)
        for identity in others:
            pipe.exists(k.inprogress(identity))
        held = pipe.execute()[1 if beat_again else 0 :]
        remembered = 0
        for identity, exists in zip(others, held, strict=True):
            if not exists:
                continue
            keys = [k.forgotten, k.inprogress(identity), k.inprogress_identities, k.last_beat]
            if script("remember")(self.client, keys, [identity]):
                remembered += 1
                logger.warning(
                    "process %s, forgotten as dead, holds jobs on its in-progress list again: "
                    "registered again; they are requeued if it stays silent",
                    identity,
                )
        return remembered

    # -- poison pills (G3) -----------------------------------------------------

    def bury_repeat_orphans(self) -> int:
        buried = 0
        for raw in self.client.lrange(self.keys.repeat_orphans, 0, -1):
            entry = {**salvage(raw), **self.repeat_orphan_error()}
            # A batch's member buried as a poison pill is dead in its batch,
            # in the same step (SPEC section 13).
            extra = effects.moved(self.keys, self.config, entry, effects.DEAD)
            moved = script("file_head")(
                self.client,
                [self.keys.repeat_orphans, self.keys.dead, *extra[0]],
                [raw, repr(time.time()), encode_stored(entry), *extra[1]],
            )
            if moved == 1:
                buried += 1
                logger.error("jid=%s orphaned too often; moved to dead", entry.get("jid"))
                self.buried_as_dead(entry)
        if buried:
            forward.soon(self.client, self.keys, self.config)  # dead in their batches, now
        return buried

    def complete_raw_burials(self, raws: list[bytes]) -> None:
        """Jobs requeue.lua filed in dead raw (its parking list unusable):
        swapped for a proper dead entry. Best effort, per job."""
        for raw in raws:
            try:
                entry = {**salvage(raw), **self.repeat_orphan_error()}
                pipe = self.client.pipeline(transaction=False)
                pipe.zadd(self.keys.dead, {encode_stored(entry): time.time()})
                pipe.zrem(self.keys.dead, raw)
                pipe.execute()
                extra = effects.moved(self.keys, self.config, entry, effects.DEAD)
                if extra[0]:
                    script("batch_move")(self.client, *extra)  # dead in its batch too
                    forward.soon(self.client, self.keys, self.config)
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

            stats.count(self.client, self.keys, failed=1)
            self.client.delete(self.keys.orphanings(str(entry.get("jid", ""))))
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

    # -- helpers ---------------------------------------------------------------

    def isolated(self, what: str, fallback: T, report: dict[str, Any] | None, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:
            outage = self.outage.failed(exc)
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
