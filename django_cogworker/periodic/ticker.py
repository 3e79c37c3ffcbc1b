"""The ticker: one thread in every worker process, enqueueing the due slots.

Duties:
- at each wake-up, the due slot of every entry, if this process has not
  handled it yet, goes to :func:`~django_cogworker.periodic.enqueue.enqueue_slot`
  (which makes it once across all processes). A slot is enqueued at most
  ``LATE_GRACE_S`` after its time: slots missed while every worker was down
  are not backfilled. Entries removed from the settings stop with the
  processes that had them;
- one broken entry is logged once per distinct error and skipped, never
  stops the others (G12); a Redis outage is logged by the shared
  :class:`~django_cogworker.outage.Outage`, not once per entry;
- every quarter of the active TTL, the running locks of this process's runs
  are extended (:data:`~django_cogworker.periodic.lock.HELD`), so a long run
  keeps the next slot off;
- it sleeps until the next slot of any entry, at most ``TICK_MAX_S``, and
  returns as soon as ``stop`` is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import redis

from django_cogworker.conf import Config
from django_cogworker.errors import EnqueueNotReplicated
from django_cogworker.keys import Keys
from django_cogworker.outage import Outage
from django_cogworker.periodic.lock import HELD, HeldLocks, active_ttl_s

if TYPE_CHECKING:
    from django_cogworker.periodic.entry import Entry

logger = logging.getLogger("django_cogworker")

#: How late a slot may still be enqueued: covers a worker restarted by a
#: deploy just after a slot, and a stalled ticker. Older slots are never
#: enqueued (no backfill).
LATE_GRACE_S = 60.0
#: The ticker wakes at the next slot of any entry, and at least this often
#: (to extend running locks, and to retry a slot whose push failed).
TICK_MAX_S = 1.0
TICK_MIN_S = 0.005


class Ticker:
    """Enqueues the due slot of every entry; extends this process's running locks."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        config: Config,
        stop: threading.Event,
        entries_: Iterable[Entry] = (),
        outage: Outage | None = None,
        held: HeldLocks = HELD,
        load: Callable[[], Iterable[Entry]] | None = None,
    ) -> None:
        self.client = client
        self.outage = outage or Outage()
        self.keys = keys
        self.config = config
        self.stop = stop
        self.held = held
        # ``load`` reads the entries when the thread starts (after
        # autodiscovery has run the ``@periodic`` decorators).
        self._load = load
        self.entries: list[Entry] = list(entries_)
        self.done_slot: dict[str, float] = {}
        self.next_at: dict[str, float] = {}
        self.failing: dict[str, str] = {}
        self.extend_every_s = active_ttl_s(config) / 4

    def run(self) -> None:
        if self._load is not None:
            self.entries = list(self._load())
        if self.entries:
            logger.info("periodic: %d entr%s", len(self.entries), "y" if len(self.entries) == 1 else "ies")
        next_extend = time.monotonic() + self.extend_every_s
        while True:
            try:
                self.tick(time.time())
                if time.monotonic() >= next_extend:
                    next_extend = time.monotonic() + self.extend_every_s
                    self.held.extend(self.client, self.keys, active_ttl_s(self.config))
            except Exception as exc:
                if not self.outage.failed(exc):
                    logger.exception("periodic ticker pass failed")
            if self.stop.wait(self.sleep_s()):
                return

    def tick(self, now: float) -> dict[str, str]:
        """One pass: each entry's due slot, if not handled yet. Returns what
        happened per pjid (for tests and logs)."""
        done: dict[str, str] = {}
        for entry in self.entries:
            try:
                outcome = self.tick_entry(entry, now)
            except Exception as exc:
                self.failed(entry, exc)
                continue
            if outcome:
                done[entry.pjid] = outcome
            if entry.pjid in self.failing:
                del self.failing[entry.pjid]
                logger.warning("periodic %s (%s) works again", entry.job, entry.cron)
        return done

    def tick_entry(self, entry: Entry, now: float) -> str:
        # Here, not at the top: a ticker with no entries never loads it.
        from django_cogworker.periodic.enqueue import PUSHED, enqueue_slot

        outcome = ""
        slot = entry.schedule.due_slot(now, LATE_GRACE_S)
        if slot is not None and self.done_slot.get(entry.pjid) != slot:
            try:
                outcome = enqueue_slot(self.client, self.keys, entry, slot, now)
            except EnqueueNotReplicated as exc:
                # Pushed, and its slot marked: not pushed again (SPEC section 11).
                logger.warning("periodic %s (%s): %s", entry.job, entry.cron, exc)
                outcome = PUSHED
            self.done_slot[entry.pjid] = slot
        next_at = self.next_at.get(entry.pjid)
        if next_at is None or next_at <= now:
            self.next_at[entry.pjid] = entry.schedule.next_run(now)
        return outcome

    def failed(self, entry: Entry, exc: BaseException) -> None:
        # G12: log and go on with the other entries; once per distinct error,
        # not every tick.
        if self.outage.failed(exc):
            return
        message = f"{type(exc).__name__}: {exc}"
        if self.failing.get(entry.pjid) != message:
            self.failing[entry.pjid] = message
            logger.error("periodic %s (%s) skipped: %s", entry.job, entry.cron, message)

    def sleep_s(self) -> float:
        # A slot already past (an entry that failed this pass) is retried at
        # the next regular wake-up, not in a busy loop.
        now = time.time()
        wake = min((at for at in self.next_at.values() if at > now), default=now + TICK_MAX_S)
        return min(TICK_MAX_S, max(TICK_MIN_S, wake - now))
