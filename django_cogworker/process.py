"""The process context: what every role of one worker process shares.

Built once by the launcher (:func:`open_process`) and handed, frozen, to
the manager, the heartbeat, the poller and recovery, each with the one or
two callables it needs besides: the same client, key names, settings,
identity, outage and stop event everywhere, and no role reaching into
another for them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from django_cogworker.conf import Config
from django_cogworker.connection import Client, get_keys, get_redis, memory
from django_cogworker.keys import Keys
from django_cogworker.outage import Outage

#: How long a stop waits for the heartbeat, poller, ticker and housekeeper
#: to finish their current pass before deregistering.
BACKGROUND_STOP_TIMEOUT_S = 5.0


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


def open_process(config: Config, identity: str, tag: str = "") -> ProcessContext:
    """The context of a worker process on the current settings' Redis."""
    client = get_redis()
    return ProcessContext(
        client=client,
        keys=get_keys(),
        config=config,
        identity=identity,
        tag=tag,
        outage=Outage(lambda: memory(client)),
        done=threading.Event(),
    )
