"""The inspection API: what the admin pages (and operators' scripts) use.

``Queue``, ``ScheduledSet``, ``RetrySet``, ``DeadSet``, ``UnsettledSet``,
``JobRecord`` (with ``retry()``, ``delete()``, ``kill()``), ``ProcessSet``,
``Workers``, ``InProgress``, ``Stats``, ``PeriodicEntries`` (SPEC section
2), ``Limit`` (section 14), ``Batch`` and ``BatchSet`` (section 13). The
admin calls only this package; no view builds a key or runs a Redis
command itself. Every move is one script that writes before it removes and
does nothing if someone else moved the entry first. Whatever Redis holds is
read through ``payload.parse``: an entry that cannot be read (not JSON,
nested thousands deep) is shown as unreadable, never an exception (SPEC
section 8). A Redis error reaches the caller as ``CogworkerError``:
``RedisUnavailable`` when Redis cannot be reached, ``RedisRefused`` when it
answered with an error (``errors.redis_boundary``, the one translation).

One module per role:

- ``records``: ``JobRecord``, its actions, ``job_names()``; ``actions``: ``bulk()``;
- ``queues``: ``Queue``;
- ``sets``: ``JobSet`` and ``SortedSet`` (``ScheduledSet``, ``RetrySet``,
  ``DeadSet``); ``unsettled``: ``UnsettledSet``;
- ``processes``: ``ProcessSet``, ``Workers``, ``RunningJob``, ``InProgress``;
- ``stats``: ``Stats`` and its daily history;
- ``periodic``: ``PeriodicEntries``;
- ``limits``: ``Limit``, the limiters (SPEC section 14): figures, and the
  limit changed at once;
- ``batches``: ``Batch``, ``BatchSet`` (section 13); ``batch_figures``:
  a batch's figures as read; ``batch_places``: where its pending members
  are now;
- ``metrics``: the per-job figures, and ``mark_deploy()``;
- ``persistence_note()``: what to say when Redis keeps nothing on disk
  (:mod:`django_cogworker.persistence`);
- ``parsing``: reading untrusted entries and fields, and the byte-level
  prefilters of the sets' search.
"""

from __future__ import annotations

from django_cogworker.api.actions import BULK_BATCH_SIZE, bulk
from django_cogworker.api.batch_figures import EVENTS, BatchFigures, Callback, batch_figures
from django_cogworker.api.batch_places import Place, places
from django_cogworker.api.batches import Batch, BatchSet
from django_cogworker.api.limits import Limit, LimitFigures, limit_figures
from django_cogworker.api.metrics import DeployMark, deploy_marks, mark_deploy
from django_cogworker.api.periodic import PeriodicEntries, PeriodicEntry
from django_cogworker.api.processes import InProgress, ProcessRecord, ProcessSet, RunningJob, Workers
from django_cogworker.api.queues import Queue, QueueFigures, queue_figures
from django_cogworker.api.records import ACTIONS, PAGE_SIZE, JobRecord, job_names
from django_cogworker.api.sets import DeadSet, JobSet, RetrySet, ScheduledSet, SortedSet
from django_cogworker.api.stats import Memory, Stats, memory
from django_cogworker.api.unsettled import UnsettledSet
from django_cogworker.errors import BatchNotFound
from django_cogworker.persistence import note as persistence_note

__all__ = [
    "ACTIONS",
    "BULK_BATCH_SIZE",
    "EVENTS",
    "PAGE_SIZE",
    "Batch",
    "BatchFigures",
    "BatchNotFound",
    "BatchSet",
    "Callback",
    "DeadSet",
    "DeployMark",
    "InProgress",
    "JobRecord",
    "JobSet",
    "Limit",
    "LimitFigures",
    "Memory",
    "PeriodicEntries",
    "PeriodicEntry",
    "Place",
    "ProcessRecord",
    "ProcessSet",
    "Queue",
    "QueueFigures",
    "RetrySet",
    "RunningJob",
    "ScheduledSet",
    "SortedSet",
    "Stats",
    "UnsettledSet",
    "Workers",
    "batch_figures",
    "bulk",
    "deploy_marks",
    "job_names",
    "limit_figures",
    "mark_deploy",
    "memory",
    "persistence_note",
    "places",
    "queue_figures",
]
