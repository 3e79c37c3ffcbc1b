"""Periodic (cron) jobs: entries, their schedule, the ticker and the running lock.

Duties:
- entries from ``COGWORKER["PERIODIC"]`` and from ``@periodic`` (stacked on a
  ``@job``), each with a stable id, the pjid (a hash of job, cron, args,
  kwargs, queue and time zone), so every process names an entry alike;
- the schedule of each entry: :class:`django_cogworker.cron.Schedule`, pure
  functions of the time;
- the ticker, one thread in every worker process: each slot of each entry
  is enqueued exactly once across all processes, because the per-slot marker
  ``N:periodic:slot:<pjid>:<slot>`` is set NX in the same Lua call as the push
  (``periodic_enqueue.lua``). A slot is enqueued at most ``LATE_GRACE_S``
  after its time: slots missed while every worker was down are not
  backfilled. Entries removed from the settings stop with the processes that
  had them. One broken entry is logged and skipped, never stops the others
  (G12);
- ``until_executed``: the running lock ``N:periodic:running:<pjid>`` = jid is
  taken with the push (queued TTL), so the next slot is skipped while a run is
  queued or running; :class:`PeriodicLockMiddleware` extends it to the active
  TTL while the job runs (and the ticker keeps extending it for long runs),
  keeps it over a retry and releases it when the run ends for good. Recovery
  and give-backs re-take it (``lua/lib/requeue_job.lua``); a poison pill filed
  in dead releases it (:mod:`django_cogworker.locks`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from django_cogworker import locks, middleware, registry
from django_cogworker.conf import Config, get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.cron import Schedule, cron_error, normalise_cron, tz_error
from django_cogworker.errors import JobNotRegistered
from django_cogworker.job import Job
from django_cogworker.keys import Keys
from django_cogworker.middleware import Result, ServerMiddleware
from django_cogworker.outage import Outage
from django_cogworker.payload import Payload, check_arguments, encode
from django_cogworker.scripts import script

logger = logging.getLogger("django_cogworker")

#: How late a slot may still be enqueued: covers a worker restarted by a
#: deploy just after a slot, and a stalled ticker. Older slots are never
#: enqueued (no backfill).
LATE_GRACE_S = 60.0
#: How long a slot's marker lives: past the grace window plus any clock skew
#: between hosts we tolerate, so a host whose clock lags cannot enqueue a
#: slot again after its marker expired.
SLOT_MARKER_TTL_S = 600
#: The ticker wakes at the next slot of any entry, and at least this often
#: (to extend running locks, and to retry a slot whose push failed).
TICK_MAX_S = 1.0
TICK_MIN_S = 0.005
#: Floor of the running lock's TTL while its job runs. The lock must outlive
#: a SIGKILLed worker until recovery re-takes it (ORPHAN_THRESHOLD plus a
#: check interval), or the ticker could start the next slot beside the
#: recovered run: see :func:`active_ttl_s`.
ACTIVE_TTL_MIN_S = 600

SETTING_KEYS = ("cron", "job", "args", "kwargs", "queue", "tz", "until_executed")
EXAMPLE = '{"cron": "*/5 * * * *", "job": "app.jobs.cleanup"}'

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# -- entries --------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    cron: str
    job: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    tz: str = "UTC"
    until_executed: bool = False
    schedule: Schedule = field(init=False, repr=False, compare=False)
    pjid: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", normalise_cron(self.cron))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "schedule", Schedule(self.cron, self.tz))
        identity = [self.job, self.cron, list(self.args), self.kwargs, self.queue, self.tz]
        pjid = hashlib.sha256(_canonical.encode(identity).encode()).hexdigest()[:32]
        object.__setattr__(self, "pjid", pjid)


def setting_problems(value: Any) -> list[tuple[str, str]]:
    """What is wrong with one ``PERIODIC`` entry, as (kind, message) pairs;
    kind is "shape", "cron" or "tz". Empty when it is fine."""
    if not isinstance(value, dict):
        return [("shape", f"must be a dict such as {EXAMPLE}, not {type(value).__name__}")]
    problems: list[tuple[str, str]] = []
    unknown = sorted(str(k) for k in set(value) - set(SETTING_KEYS))
    if unknown:
        problems.append(
            ("shape", f"has unknown key(s) {', '.join(unknown)}; the keys are {', '.join(SETTING_KEYS)}")
        )
    for key in ("cron", "job"):
        if key not in value:
            problems.append(("shape", f"has no {key!r}"))
    job = value.get("job", "?")
    if not isinstance(job, str) or not job:
        problems.append(("shape", f"'job' must be the registry name of a @job (a string), got {job!r}"))
    args, kwargs = value.get("args", []), value.get("kwargs", {})
    if not isinstance(args, list | tuple):
        problems.append(("shape", f"'args' must be a list, got {type(args).__name__}"))
    elif not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        problems.append(("shape", "'kwargs' must be a dict with string keys"))
    else:
        try:
            check_arguments(str(job), list(args), kwargs)
        except TypeError as exc:
            problems.append(("shape", str(exc)))
    queue = value.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        problems.append(("shape", f"'queue' must be a queue name or None, got {queue!r}"))
    if not isinstance(value.get("until_executed", False), bool):
        problems.append(("shape", f"'until_executed' must be True or False, got {value['until_executed']!r}"))
    if "cron" in value:
        problem = cron_error(value["cron"])
        if problem:
            problems.append(("cron", f"'cron' {value['cron']!r} {problem}"))
    tz = value.get("tz", "UTC")
    problem = tz_error(tz)
    if problem:
        problems.append(("tz", f"'tz' {tz!r} {problem}"))
    return problems


def parse_setting(value: Any) -> Entry:
    """An entry of ``COGWORKER["PERIODIC"]``; ValueError says what is wrong."""
    problems = setting_problems(value)
    if problems:
        raise ValueError("; ".join(message for _, message in problems))
    return Entry(
        cron=value["cron"],
        job=value["job"],
        args=tuple(value.get("args", ())),
        kwargs=dict(value.get("kwargs") or {}),
        queue=value.get("queue"),
        tz=value.get("tz", "UTC"),
        until_executed=value.get("until_executed", False),
    )


_decorated: list[Entry] = []


def periodic(
    cron: str,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    tz: str = "UTC",
    until_executed: bool = False,
) -> Callable[[Job], Job]:
    """Runs a ``@job`` on a cron schedule; goes above ``@job`` and may be
    stacked for several schedules::

        @periodic("0 3 * * *", tz="Europe/Berlin")
        @job
        def nightly_report(): ...
    """

    def wrap(made: Job) -> Job:
        if not isinstance(made, Job):
            raise TypeError(f"@periodic decorates a @job, got {made!r}: put @periodic(...) above @job")
        value = {
            "cron": cron,
            "job": made.name,
            "args": list(args),
            "kwargs": dict(kwargs or {}),
            "queue": queue,
            "tz": tz,
            "until_executed": until_executed,
        }
        problems = setting_problems(value)
        if problems:
            raise ValueError(f"@periodic on {made.name}: " + "; ".join(m for _, m in problems))
        entry = parse_setting(value)
        if all(e.pjid != entry.pjid for e in _decorated):
            _decorated.append(entry)
        return made

    return wrap


def entries(config: Config | None = None, *, log: bool = False) -> list[Entry]:
    """The entries of the settings, then the decorated ones, without
    duplicates. A broken settings entry is left out (logged if ``log``)."""
    config = config or get_config()
    found: list[Entry] = []
    seen: set[str] = set()
    for index, value in enumerate(config.periodic):
        try:
            entry = parse_setting(value)
        except ValueError as exc:
            if log:
                logger.error("COGWORKER['PERIODIC'][%d] skipped: %s", index, exc)
            continue
        if entry.pjid not in seen:
            seen.add(entry.pjid)
            found.append(entry)
    for entry in _decorated:
        if entry.pjid not in seen:
            seen.add(entry.pjid)
            found.append(entry)
    return found


def entry_queue(entry: Entry) -> str:
    job = registry.get(entry.job)
    return entry.queue or (job.queue if job is not None else "default")


# -- enqueueing a slot ------------------------------------------------------------

PUSHED = "pushed"
ALREADY = "already"  # another process (or this one) enqueued or skipped the slot
SKIPPED = "skipped"  # until_executed: the previous run still holds the lock
REFUSED = "refused"  # a client middleware refused the payload


def slot_payload(entry: Entry, slot: float, now: float) -> Payload:
    job = registry.get(entry.job)
    if job is None:
        raise JobNotRegistered(
            f"periodic entry for {entry.job!r}: no @job with that name is registered in this process"
        )
    if entry.queue:
        job = job.set(queue=entry.queue)
    payload = job.payload(entry.args, dict(entry.kwargs), now)
    payload["periodic_pjid"] = entry.pjid
    payload["periodic_slot"] = int(slot)
    if entry.until_executed:
        payload["periodic_until_executed"] = True
    return payload


def enqueue_slot(client: redis.Redis, keys: Keys, entry: Entry, slot: float, now: float) -> str:
    """Enqueues one slot unless any process did it first. Returns PUSHED,
    ALREADY, SKIPPED or REFUSED."""
    from django_cogworker.manager import PERIODIC_QUEUED_TTL_S

    marker = keys.periodic_slot(entry.pjid, int(slot))
    # Cheap first look, so that the client chain (a unique lock, a user's
    # middleware) runs about once per slot, not once per process.
    if client.exists(marker):
        return ALREADY
    chain = middleware.client_chain()
    payload = chain.run(slot_payload(entry, slot, now))
    if payload is None:
        return REFUSED
    queue = str(payload["queue"])
    try:
        reply = script("periodic_enqueue")(
            client,
            [marker, keys.periodic_running(entry.pjid), keys.queue(queue), keys.queues, keys.periodic_last],
            [
                encode(payload),
                queue,
                SLOT_MARKER_TTL_S,
                "1" if entry.until_executed else "0",
                str(payload["jid"]),
                PERIODIC_QUEUED_TTL_S,
                entry.pjid,
                repr(now),
            ],
        )
    except BaseException:
        chain.cancel(payload)
        raise
    if int(reply) == 1:
        logger.info("periodic %s (%s): enqueued jid=%s", entry.job, entry.cron, payload["jid"])
        return PUSHED
    chain.cancel(payload)
    if int(reply) == -1:
        logger.info(
            "periodic %s (%s): slot skipped, the previous run is still queued or running",
            entry.job,
            entry.cron,
        )
        return SKIPPED
    return ALREADY


# -- the running lock -------------------------------------------------------------


def active_ttl_s(config: Config) -> int:
    """The running lock's TTL while its job runs: outlives the time recovery
    takes to notice a dead worker (see ACTIVE_TTL_MIN_S)."""
    recovery_s = 2 * (config.orphan_threshold_s + config.orphan_check_interval_s) + config.heartbeat_ttl_s
    return int(max(ACTIVE_TTL_MIN_S, recovery_s))


def hold(client: redis.Redis, keys: Keys, pjid: str, jid: str, ttl_s: float) -> bool:
    """Takes the running lock for ``jid`` if it is free, or extends it if
    ``jid`` owns it; never takes it from another run. True if ``jid`` holds it."""
    return bool(script("periodic_hold")(client, [keys.periodic_running(pjid)], [jid, max(1, int(ttl_s))]))


class HeldLocks:
    """The running locks of the jobs this process runs now (jid -> pjid), for
    the ticker to extend during long runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[str, int]] = {}

    def add(self, jid: str, pjid: str) -> None:
        with self._lock:
            _, count = self._runs.get(jid, (pjid, 0))
            self._runs[jid] = (pjid, count + 1)

    def remove(self, jid: str) -> None:
        with self._lock:
            pjid, count = self._runs.get(jid, ("", 0))
            if count <= 1:
                self._runs.pop(jid, None)
            else:
                self._runs[jid] = (pjid, count - 1)

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(jid, pjid) for jid, (pjid, _) in self._runs.items()]

    def extend(self, client: redis.Redis, keys: Keys, ttl_s: float) -> int:
        extended = 0
        for jid, pjid in self.snapshot():
            try:
                extended += hold(client, keys, pjid, jid, ttl_s)
            except Exception as exc:
                logger.error("could not extend the running lock of jid=%s: %s", jid, exc)
        return extended


HELD = HeldLocks()


def _lock_owner(payload: Payload) -> tuple[str, str] | None:
    pjid, jid = payload.get("periodic_pjid"), payload.get("jid")
    if (
        payload.get("periodic_until_executed") is True
        and isinstance(pjid, str)
        and pjid
        and isinstance(jid, str)
    ):
        return pjid, jid
    return None


class PeriodicLockMiddleware(ServerMiddleware):
    """The running lock of an ``until_executed`` entry around its run."""

    def before(self, payload: Payload) -> None:
        owner = _lock_owner(payload)
        if owner is None:
            return
        pjid, jid = owner
        HELD.add(jid, pjid)
        try:
            hold(get_redis(), get_keys(), pjid, jid, active_ttl_s(get_config()))
        except Exception as exc:
            # The lock still has its queued TTL; the ticker tries again.
            logger.error("could not extend the running lock of jid=%s: %s", jid, exc)

    def after(self, payload: Payload, result: Result) -> None:
        owner = _lock_owner(payload)
        if owner is None:
            return
        pjid, jid = owner
        HELD.remove(jid)
        if result.final:
            locks.release_owned(get_redis(), get_keys().periodic_running(pjid), jid)
            return
        # A retry is the same run, waiting: keep the next slot off until the
        # retry is due and has had the queued TTL to start.
        from django_cogworker.manager import PERIODIC_QUEUED_TTL_S

        wait_s = max(0.0, (result.retry_at or time.time()) - time.time())
        hold(get_redis(), get_keys(), pjid, jid, PERIODIC_QUEUED_TTL_S + wait_s)


# -- the ticker -----------------------------------------------------------------


class Ticker:
    """Enqueues the due slot of every entry; extends this process's running locks."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        config: Config,
        stop: threading.Event,
        entries_: Iterable[Entry] | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.client = client
        self.outage = outage or Outage()
        self.keys = keys
        self.config = config
        self.stop = stop
        # Read from the settings when the thread starts (after autodiscovery).
        self._load = entries_ is None
        self.entries: list[Entry] = list(entries_ or ())
        self.done_slot: dict[str, float] = {}
        self.next_at: dict[str, float] = {}
        self.failing: dict[str, str] = {}
        self.extend_every_s = active_ttl_s(config) / 4

    def run(self) -> None:
        if self._load:
            self.entries = entries(self.config, log=True)
        if self.entries:
            logger.info("periodic: %d entr%s", len(self.entries), "y" if len(self.entries) == 1 else "ies")
        next_extend = time.monotonic() + self.extend_every_s
        while True:
            try:
                self.tick(time.time())
                if time.monotonic() >= next_extend:
                    next_extend = time.monotonic() + self.extend_every_s
                    HELD.extend(self.client, self.keys, active_ttl_s(self.config))
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
        outcome = ""
        slot = entry.schedule.due_slot(now, LATE_GRACE_S)
        if slot is not None and self.done_slot.get(entry.pjid) != slot:
            outcome = enqueue_slot(self.client, self.keys, entry, slot, now)
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
