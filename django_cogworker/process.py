"""The process context: what every role of one worker process shares.

Built once by the launcher (:func:`open_process`) and handed, frozen, to
the manager, the heartbeat, the poller and recovery, each with the one or
two callables it needs besides: the same client, key names, settings,
identity, outage and stop event everywhere, and no role reaching into
another for them.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from django_cogworker.conf import Config, QueueSpec
from django_cogworker.connection import Client, get_keys, get_redis, memory
from django_cogworker.errors import ConfigurationError
from django_cogworker.keys import Keys
from django_cogworker.outage import Outage

#: How long a stop waits for the heartbeat, poller, ticker and housekeeper
#: to finish their current pass before deregistering.
BACKGROUND_STOP_TIMEOUT_S = 5.0


#: How often a thread waiting for a beat looks at the quiet event.
QUIET_CHECK_S = 1.0


class Registration:
    """When this process last told Redis, with a beat, that it is alive and
    owns its in-progress list (G18). A process silent for longer than
    ``HEARTBEAT_TTL`` (stopped, cut off, its heartbeat starved) may have been
    taken for dead meanwhile: its jobs recovered and its registration
    forgotten, so that a job fetched into its list then would sit where no
    recovery looks. Its threads fetch again only after a beat has
    registered it anew; so no fetch is sent later than ``HEARTBEAT_TTL``
    after the last beat, which is what lets recovery tell when a list can
    no longer be filled (``Recovery.forget_if_empty``)."""

    def __init__(self, ttl_s: float = math.inf) -> None:
        self.ttl_s = ttl_s
        self._at = -math.inf  # monotonic time at which the last successful beat was sent
        self._renewed = threading.Condition()

    def renewed(self, sent_at: float) -> None:
        """A beat sent at ``sent_at`` (monotonic) succeeded."""
        with self._renewed:
            self._at = max(self._at, sent_at)
            self._renewed.notify_all()

    def fresh(self) -> bool:
        return time.monotonic() - self._at <= self.ttl_s

    def stamp(self) -> float:
        """When a fetch sent now counts as sent (G18): now while the
        registration is fresh; else when the last successful beat was sent.
        A stop can fall between a thread's check (``awaited``) and its send:
        the jobs such a fetch brings then look fetched long ago, and are
        checked to be still ours, after a beat, before they start
        (``Processor.still_ours``)."""
        now = time.monotonic()
        return now if now - self._at <= self.ttl_s else self._at

    def awaited(self, quiet: threading.Event) -> bool:
        """Whether the registration is fresh, after waiting for a beat if it
        is not (False: ``quiet`` was set first)."""
        while not self.fresh():
            if quiet.is_set():
                return False
            with self._renewed:
                self._renewed.wait_for(self.fresh, QUIET_CHECK_S)
        return True


@dataclass(frozen=True)
class ProcessContext:
    """One worker process, as its roles see it."""

    client: Client
    keys: Keys
    config: Config
    #: ``host:pid:random``: the name of this process's records and in-progress list.
    identity: str
    #: The ``--tag`` shown beside the process in the admin.
    tag: str
    #: The one view of a Redis outage that every role reports to (SPEC section 8).
    outage: Outage
    #: Set on stop: every background loop waits on it, so none holds a stop up.
    done: threading.Event
    #: Renewed by each beat; the reliable fetch waits for it (G18).
    registration: Registration = field(default_factory=Registration)


def served_keys(config: Config, queues: tuple[QueueSpec, ...] | None = None) -> Keys:
    """The keys a worker of ``queues`` (``--queue``, else ``config.queues``)
    works with: under ``SHARDING``, those of the one queue group its queues
    are in (its in-progress list, sets and beats live under that group's tag)."""
    keys = get_keys()
    if not keys.sharded:
        return keys
    groups = sorted({keys.group_of(q.name) for q in queues or config.queues})
    if len(groups) != 1:
        raise ConfigurationError(
            f"Under SHARDING a worker process serves the queues of one group, and these are in "
            f"{len(groups)}: {', '.join(map(repr, groups))}. Start it with manage.py cogworker, "
            "which runs a process per group, or list them in one QUEUE_GROUPS entry."
        )
    return keys.group(groups[0])


def open_process(
    config: Config, identity: str, tag: str = "", queues: tuple[QueueSpec, ...] | None = None
) -> ProcessContext:
    """The context of a worker process of ``queues`` (default: the
    settings') on the current settings' Redis."""
    client = get_redis()
    return ProcessContext(
        client=client,
        keys=served_keys(config, queues),
        config=config,
        identity=identity,
        tag=tag,
        outage=Outage(lambda: memory(client)),
        done=threading.Event(),
        registration=Registration(config.heartbeat_ttl_s),
    )
