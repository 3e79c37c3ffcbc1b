"""The launcher: one worker process from boot to exit.

Duties: beat before the first fetch; start the manager's processors, the
heartbeat, the poller, the periodic ticker and the housekeeper (orphan
recovery at boot with a key scan and every ``ORPHAN_CHECK_INTERVAL``,
settlement and strays every beat);
turn signals into actions (TERM/INT stop, TSTP quiet, TTIN thread dump; the
same "quiet" and "stop" sent through Redis from the admin); on stop, let the
manager finish (G8), then have the heartbeat deregister. A run stuck past its
``hard_timeout`` stops the process the same way, with ``exit_status`` 3
(``HARD_TIMEOUT_EXIT_STATUS``), for its supervisor to start a fresh one.

It builds the process context (``process.py``) once and hands it to every
role; none of them imports this module.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from django_cogworker import connection, middleware, periodic, persistence, registry, threads
from django_cogworker.backoff import Backoff
from django_cogworker.conf import Config, QueueSpec
from django_cogworker.errors import RedisAccessRefused, refusal, without_redis_frames
from django_cogworker.heartbeat import Heartbeat, Status
from django_cogworker.manager import Manager
from django_cogworker.outage import is_outage
from django_cogworker.periodic.ticker import Ticker
from django_cogworker.poller import Poller
from django_cogworker.process import BACKGROUND_STOP_TIMEOUT_S, open_process
from django_cogworker.recovery import Recovery
from django_cogworker.settle import file_unsettled
from django_cogworker.supervisor_watch import watch_supervisor

logger = logging.getLogger("django_cogworker")

#: How long to keep trying the first beat before giving up at boot.
BOOT_RETRY_MAX_S = 5.0

#: The exit status of a process stopped by a run stuck past its
#: ``hard_timeout`` (SPEC section 14): 0 is a stop asked for, 1 an error.
HARD_TIMEOUT_EXIT_STATUS = 3
#: The exit status of a process whose event loop of async jobs died.
CRASH_EXIT_STATUS = 1


def new_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Launcher:
    def __init__(
        self,
        config: Config,
        *,
        queues: tuple[QueueSpec, ...] | None = None,
        concurrency: int | None = None,
        fetch: str | None = None,
        shutdown_timeout_s: float | None = None,
        tag: str = "",
        identity: str | None = None,
    ) -> None:
        self.config = config
        self.process = process = open_process(config, identity or new_identity(), tag, queues)
        self.identity = process.identity
        self.signals: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.background: list[threading.Thread] = []  # heartbeat, poller, ticker, housekeeper
        #: For the command to exit with: 0, or HARD_TIMEOUT_EXIT_STATUS.
        self.exit_status = 0
        self.manager = Manager(
            process,
            queues or config.queues,
            concurrency or config.concurrency,
            fetch or config.fetch,
            config.shutdown_timeout_s if shutdown_timeout_s is None else shutdown_timeout_s,
        )
        self.manager.on_stuck = lambda: self.signals.put("hard_timeout")
        self.manager.on_crash = lambda: self.signals.put("crashed")
        self.recovery = Recovery(process)
        self.heartbeat = Heartbeat(process, self.manager.ledger, self.status, self.remote_signal)
        self.poller = Poller(process)
        self.ticker = Ticker(
            process.client,
            process.keys,
            config,
            process.done,
            outage=process.outage,
            load=lambda: periodic.entries(config, log=True),
        )

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        self.install_signal_handlers()
        # Under --processes: stop as on SIGTERM once the supervisor is gone,
        # even SIGKILLed, instead of working on beside its successor (G20).
        watch_supervisor(lambda: self.signals.put("stop"), self.thread_crashed)
        registered = registry.names()
        logger.info(
            "cogworker %s starting: queues %s, %d jobs registered, concurrency %d, fetch %s, redis %s",
            self.identity,
            ",".join(q.name for q in self.manager.queues),
            len(registered),
            self.manager.concurrency,
            self.manager.fetch_mode,  # --fetch may override the setting
            connection.describe(self.config),  # never the password
        )
        logger.debug("cogworker %s jobs registered: %s", self.identity, ", ".join(registered) or "none")
        c = self.config
        logger.debug(
            "cogworker %s timings: heartbeat every %gs (ttl %gs), orphan threshold %gs, orphan check "
            "every %gs, max orphanings %d, poll every %gs, shutdown timeout %gs",
            self.identity,
            c.heartbeat_interval_s,
            c.heartbeat_ttl_s,
            c.orphan_threshold_s,
            c.orphan_check_interval_s,
            c.max_orphanings,
            c.poll_interval_s,
            self.manager.shutdown_timeout_s,
        )
        # Built before the first fetch: a middleware path that cannot be
        # imported stops the process here instead of failing every job.
        middleware.client_chain()
        middleware.server_chain()
        if not self.first_beat():
            return
        if persistence.keeps_nothing(self.manager.client):
            logger.warning("%s", persistence.NOTE)
        self.manager.start()
        self.background = [
            threads.start("cogworker-heartbeat", self.heartbeat.run, self.thread_crashed),
            threads.start("cogworker-poller", self.poller.run, self.thread_crashed),
            threads.start("cogworker-periodic", self.ticker.run, self.thread_crashed),
            threads.start("cogworker-housekeeper", self.housekeep, self.thread_crashed),
        ]
        if self.process.keys.sharded:
            self.background.append(
                threads.start("cogworker-group-beat", self.heartbeat.run_group, self.thread_crashed)
            )
        while True:
            try:
                what = self.signals.get(timeout=1.0)
            except queue.Empty:
                continue
            if what in ("stop", "hard_timeout", "crashed"):
                if what == "crashed":
                    self.exit_status = CRASH_EXIT_STATUS
                break
            self.handle(what)
        self.stop()

    def first_beat(self) -> bool:
        """Beat before the first fetch; resolve the fetch first, so the beat
        says whether this process registers an in-progress list."""
        pauses = Backoff(max_s=BOOT_RETRY_MAX_S)
        hinted = False
        while True:
            try:
                self.manager.fetcher()
                self.heartbeat.beat()
                self.process.outage.succeeded()
                return True
            except Exception as exc:
                hint = refusal(exc)
                if hint is not None:
                    raise RedisAccessRefused(
                        f"cogworker cannot start: Redis at {connection.describe(self.config)} said "
                        f"{str(exc)[:300].rstrip('.')}. {hint[0].upper()}{hint[1:]}."
                    ) from without_redis_frames(exc)
                if not self.process.outage.failed(exc):
                    logger.error("could not start (%s: %s); retrying", type(exc).__name__, exc)
                elif not hinted and is_outage(exc):
                    hinted = True
                    logger.error(
                        "cogworker %s waits for Redis at %s: start Redis there, or set "
                        "COGWORKER['REDIS_URL'] = 'embedded' for development; work starts when it answers",
                        self.identity,
                        connection.describe(self.config),
                    )
            try:
                what = self.signals.get(timeout=pauses.next_s())
            except queue.Empty:
                what = ""
            if what == "stop":
                return False

    def stop(self) -> None:
        logger.info(
            "cogworker %s stopping (waiting up to %.0fs for running jobs)",
            self.identity,
            self.manager.shutdown_timeout_s,
        )
        self.manager.stop()
        self.process.done.set()
        # A beat still in flight would register this process again right
        # after it deregistered (a dead process in the admin, and in the
        # registry until a recovery forgets it): let the background threads
        # finish their current pass first.
        deadline = time.monotonic() + BACKGROUND_STOP_TIMEOUT_S
        for thread in self.background:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.heartbeat.deregister()
        if self.manager.stuck:
            self.exit_status = HARD_TIMEOUT_EXIT_STATUS
            logger.error(
                "cogworker %s stopped: a job passed its hard_timeout; exiting with status %d",
                self.identity,
                self.exit_status,
            )
        else:
            logger.info("cogworker %s stopped", self.identity)

    def status(self) -> Status:
        """What the heartbeat says of the work on each beat."""
        m = self.manager
        return Status({**m.status(), "recovery": json.dumps(self.recovery.last_report)}, m.reliable)

    # -- housekeeping ------------------------------------------------------------

    def housekeep(self) -> None:
        """Every beat: settle what is owed and requeue strays (G6, G7); every
        ORPHAN_CHECK_INTERVAL, and at boot with a key scan: orphan recovery
        (reliable fetch only), poison pills and unsettled jobs."""
        recovery, settler = self.recovery, self.manager.settler
        scan = True
        next_check = time.monotonic()
        while True:
            if time.monotonic() >= next_check:
                if self.manager.reliable:
                    recovery.recover_orphans(scan=scan)
                else:
                    recovery.isolated("burying repeat orphans", 0, None, recovery.bury_repeat_orphans)
                recovery.isolated("filing unsettled jobs", 0, None, self.file_unsettled)
                scan = False
                next_check = time.monotonic() + self.orphan_check_interval_s()
            if self.process.done.wait(self.config.heartbeat_interval_s):
                return
            if self.manager.reliable:
                recovery.isolated("reconciling this process's list", None, None, settler.reconcile)

    def file_unsettled(self) -> int:
        return file_unsettled(self.manager.context)

    def orphan_check_interval_s(self) -> float:
        return self.config.orphan_check_interval_s * (0.9 + 0.2 * random.random())

    # -- signals ---------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        names = {
            signal.SIGTERM: "stop",
            signal.SIGINT: "stop",
            signal.SIGTSTP: "quiet",
            signal.SIGTTIN: "dump",
        }
        for signum, what in names.items():
            signal.signal(signum, self._signal_handler(what))

    def _signal_handler(self, what: str) -> Callable[[int, Any], None]:
        def handler(_signum: int, _frame: Any) -> None:
            self.signals.put(what)

        return handler

    def remote_signal(self, what: str) -> None:
        if what in ("quiet", "stop", "dump"):
            logger.info("received %s through Redis", what)
            self.signals.put(what)

    def handle(self, what: str) -> None:
        if what == "quiet":
            logger.info("quiet: no new jobs will be fetched")
            self.manager.stop_fetching()
        elif what == "dump":
            threads.dump()

    def thread_crashed(self, name: str) -> None:
        logger.critical("%s died; stopping this process so that its supervisor restarts it", name)
        self.signals.put("stop")
