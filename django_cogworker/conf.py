"""Settings: one ``COGWORKER`` dict merged over the documented defaults.

Read through :func:`get_config`, cached and cleared on ``setting_changed`` so
that ``override_settings`` in tests takes effect at once. Validation lives in
:mod:`django_cogworker.checks`; this module only merges and normalises.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from django_cogworker import redis_url

DEFAULT_REDIS_URL = "redis://localhost:6379/0"

#: The queue of a job that names none, and of a payload whose queue cannot
#: be read (the worker then files it in dead, G13).
DEFAULT_QUEUE = "default"

#: Every key of ``COGWORKER`` with its default. Durations are seconds.
DEFAULTS: dict[str, Any] = {
    "REDIS_URL": None,  # None: env COGWORKER_REDIS_URL, else DEFAULT_REDIS_URL
    "SENTINEL_OPTIONS": {},
    "CACHE_ALIAS": None,
    "REDIS_OPTIONS": {},
    "NAMESPACE": None,  # None: DEFAULT_NAMESPACE, or CLUSTER_NAMESPACE for a redis+cluster:// URL
    "QUEUES": [DEFAULT_QUEUE],
    # "queues": a hash tag per queue group on a Redis Cluster, so that the
    # queues spread over its masters (SPEC section 16; keys.ShardedKeys).
    "SHARDING": None,
    # Group name -> its queues, kept under one tag (one slot); a queue no
    # group lists is a group of its own.
    "QUEUE_GROUPS": {},
    # Queue name -> at most that many of its jobs at once, across every
    # process (SPEC section 14; limits.for_queue).
    "QUEUE_LIMITS": {},
    "CONCURRENCY": 10,
    # ``async def`` jobs run at once on a process's event loop, besides its
    # CONCURRENCY threads (SPEC section 15); the loop starts only in a
    # process where such a job is registered.
    "ASYNC_CONCURRENCY": 100,
    "FETCH": "reliable",  # a name of fetch.STRATEGIES
    # None: the CPUs, scheduling policy and niceness stay as the OS gave them
    # (G21); "auto" or a list of CPU numbers pins each process (affinity.py).
    "CPU_AFFINITY": None,
    # Long enough to ride out a Redis failover or a stalled process, short
    # enough that a crashed worker's jobs come back within minutes.
    "ORPHAN_THRESHOLD": 300,
    "MAX_ORPHANINGS": 3,
    "ORPHAN_CHECK_INTERVAL": 60,
    "HEARTBEAT_INTERVAL": 10,
    "HEARTBEAT_TTL": 60,
    "FETCH_IDLE_MAX_INTERVAL": 2.0,
    "POLL_INTERVAL": 5,
    "SHUTDOWN_TIMEOUT": 25,
    "DEFAULT_RETRY": 25,
    "DEAD_MAX_JOBS": 10_000,
    "DEAD_TIMEOUT": 180 * 24 * 3600,
    "ENQUEUE_ON_COMMIT": True,
    # .delay()'s push and the fetch call past redis-py's layers, where
    # redispy.py finds it safe (direct.py); False: redis-py's public API only.
    "FAST_PATH": True,
    "PERIODIC": [],
    "MIDDLEWARE": {"client": [], "server": []},
    "ERROR_HANDLERS": [],
    "ENQUEUE_WAIT_REPLICAS": 0,
    "ENQUEUE_WAIT_TIMEOUT": 1.0,
    # Where REDIS_URL = "embedded" keeps its socket, pid file and AOF.
    "EMBEDDED_DIR": None,
    # The bearer token the metrics view accepts; None: staff sessions only.
    "METRICS_TOKEN": None,
    # Workflows (SPEC section 13): an open batch's keys live this long,
    # renewed by each member's end; a settled batch's this long after.
    "BATCH_TTL": 30 * 24 * 3600,
    "BATCH_DONE_TTL": 7 * 24 * 3600,
    # A chord member's (or a chain step's) return value, encoded as JSON, at
    # most this many bytes: it is kept in Redis until the batch settles.
    "BATCH_RESULT_MAX_BYTES": 1024 * 1024,
}

DEFAULT_NAMESPACE = "cogworker"
#: The hash tag keeps every key in one slot of a Redis Cluster: scripts and
#: transactions touch several keys at once.
CLUSTER_NAMESPACE = "{cogworker}"


@dataclass(frozen=True)
class QueueSpec:
    name: str
    weight: int  # 0 when no weight was given (strict order)


@dataclass(frozen=True, repr=False)
class Config:
    redis_url: str
    cache_alias: str | None
    redis_options: dict[str, Any]
    sentinel_options: dict[str, Any]
    namespace: str
    queues: tuple[QueueSpec, ...]
    #: None, or "queues" (``SHARDING``).
    sharding: str | None
    #: Queue -> group pairs from ``QUEUE_GROUPS`` (hashable: ``keys.keys`` caches on it).
    queue_groups: tuple[tuple[str, str], ...]
    #: Queue name -> its concurrency limit (``QUEUE_LIMITS``); empty: none.
    queue_limits: dict[str, int]
    concurrency: int
    async_concurrency: int
    fetch: str
    #: None (the OS decides), "auto", or the CPUs listed (see :mod:`django_cogworker.affinity`).
    cpu_affinity: str | tuple[int, ...] | None
    orphan_threshold_s: float
    max_orphanings: int
    orphan_check_interval_s: float
    heartbeat_interval_s: float
    heartbeat_ttl_s: float
    fetch_idle_max_interval_s: float
    poll_interval_s: float
    shutdown_timeout_s: float
    default_retry: int
    dead_max_jobs: int
    dead_timeout_s: float
    enqueue_on_commit: bool
    #: Whether :mod:`django_cogworker.direct` may take its lean round trip.
    fast_path: bool
    periodic: tuple[dict[str, Any], ...]
    client_middleware: tuple[str, ...]
    server_middleware: tuple[str, ...]
    error_handlers: tuple[str, ...]
    enqueue_wait_replicas: int
    enqueue_wait_timeout_s: float
    embedded_dir: str
    #: ``views.metrics`` answers ``Authorization: Bearer <metrics_token>``.
    metrics_token: str | None
    batch_ttl_s: float
    batch_done_ttl_s: float
    batch_result_max_bytes: int

    @property
    def weighted(self) -> bool:
        return any(q.weight for q in self.queues)

    def __repr__(self) -> str:
        # A Config is a local of the enqueue path: Sentry's events and
        # Django's DEBUG page print the locals of a failed .delay(). The URL
        # masked, the options' secrets redacted, the token hidden.
        shown = {f.name: repr(getattr(self, f.name)) for f in fields(self)}
        shown["redis_url"] = repr(redis_url.masked(self.redis_url))
        shown["redis_options"] = redis_url.redacted(self.redis_options)
        shown["sentinel_options"] = redis_url.redacted(self.sentinel_options)
        shown["metrics_token"] = repr(None if self.metrics_token is None else redis_url.MASK)
        return f"Config({', '.join(f'{name}={text}' for name, text in shown.items())})"


def parse_queue(spec: str) -> QueueSpec:
    """``"name"`` or ``"name,weight"``; raises ValueError with the reason."""
    name, _, weight = str(spec).partition(",")
    name = name.strip()
    if not name:
        raise ValueError(f"queue {spec!r} has no name")
    if not weight:
        return QueueSpec(name, 0)
    try:
        value = int(weight)
    except ValueError:
        raise ValueError(f"queue {spec!r}: the weight must be a whole number") from None
    if value < 1:
        raise ValueError(f"queue {spec!r}: the weight must be at least 1")
    return QueueSpec(name, value)


@dataclass(frozen=True)
class QueueListProblems:
    """What is wrong with a list of parsed queues as a whole. The QUEUES
    check and ``--queue`` each word it for their reader."""

    #: Names listed more than once (sorted): a weight, not a repetition,
    #: makes a queue fetched more often.
    repeated: tuple[str, ...]
    #: Weighted queues beside unweighted ones. No weights means strict
    #: order, weights mean weighted random order; mixed, the unweighted
    #: queues would never be fetched at all.
    mixed: bool

    def __bool__(self) -> bool:
        return bool(self.repeated) or self.mixed


def queue_list_problems(specs: Iterable[QueueSpec]) -> QueueListProblems:
    """The rule of a list of queues, each ``"name"`` or ``"name,weight"``:
    every name once, and weights on every queue or on none."""
    specs = list(specs)
    names = [s.name for s in specs]
    return QueueListProblems(
        repeated=tuple(sorted({n for n in names if names.count(n) > 1})),
        mixed=len({bool(s.weight) for s in specs}) > 1,
    )


def user_settings() -> dict[str, Any]:
    value = getattr(settings, "COGWORKER", {})
    return value if isinstance(value, dict) else {}


def merged() -> dict[str, Any]:
    values = {**DEFAULTS, **user_settings()}
    if not values["REDIS_URL"]:
        values["REDIS_URL"] = os.environ.get("COGWORKER_REDIS_URL") or DEFAULT_REDIS_URL
    if values["NAMESPACE"] is None and values["SHARDING"]:
        values["NAMESPACE"] = DEFAULT_NAMESPACE  # each group's tag and {N} are added to it
    elif values["NAMESPACE"] is None:
        cluster = isinstance(values["REDIS_URL"], str) and values["REDIS_URL"].startswith(
            ("redis+cluster://", "rediss+cluster://")
        )
        values["NAMESPACE"] = CLUSTER_NAMESPACE if cluster else DEFAULT_NAMESPACE
    return values


@functools.cache
def get_config() -> Config:
    values = merged()
    middleware = values["MIDDLEWARE"] or {}
    embedded_dir = values["EMBEDDED_DIR"] or os.path.join(
        str(getattr(settings, "BASE_DIR", os.getcwd())), ".cogworker"
    )
    # "" or a non-string (E027) accepts no bearer at all: an empty token
    # must never match an empty Authorization header. Stripped: read from
    # a file with its newline, it would never match (the bearer is stripped).
    token = values["METRICS_TOKEN"]
    token = token.strip() if isinstance(token, str) else None
    return Config(
        redis_url=str(values["REDIS_URL"]),
        cache_alias=values["CACHE_ALIAS"],
        redis_options=redis_url.Options(values["REDIS_OPTIONS"]),
        sentinel_options=redis_url.Options(values["SENTINEL_OPTIONS"]),
        namespace=str(values["NAMESPACE"]),
        queues=tuple(parse_queue(q) for q in values["QUEUES"]),
        sharding=values["SHARDING"] if values["SHARDING"] is None else str(values["SHARDING"]),
        queue_groups=_queue_groups(values["QUEUE_GROUPS"]),
        queue_limits=_queue_limits(values["QUEUE_LIMITS"]),
        concurrency=int(values["CONCURRENCY"]),
        async_concurrency=int(values["ASYNC_CONCURRENCY"]),
        fetch=str(values["FETCH"]),
        cpu_affinity=_cpu_affinity(values["CPU_AFFINITY"]),
        orphan_threshold_s=float(values["ORPHAN_THRESHOLD"]),
        max_orphanings=int(values["MAX_ORPHANINGS"]),
        orphan_check_interval_s=float(values["ORPHAN_CHECK_INTERVAL"]),
        heartbeat_interval_s=float(values["HEARTBEAT_INTERVAL"]),
        heartbeat_ttl_s=float(values["HEARTBEAT_TTL"]),
        fetch_idle_max_interval_s=float(values["FETCH_IDLE_MAX_INTERVAL"]),
        poll_interval_s=float(values["POLL_INTERVAL"]),
        shutdown_timeout_s=float(values["SHUTDOWN_TIMEOUT"]),
        default_retry=int(values["DEFAULT_RETRY"]),
        dead_max_jobs=int(values["DEAD_MAX_JOBS"]),
        dead_timeout_s=float(values["DEAD_TIMEOUT"]),
        enqueue_on_commit=bool(values["ENQUEUE_ON_COMMIT"]),
        fast_path=bool(values["FAST_PATH"]),
        periodic=tuple(values["PERIODIC"]),
        client_middleware=tuple(middleware.get("client", ())),
        server_middleware=tuple(middleware.get("server", ())),
        error_handlers=tuple(values["ERROR_HANDLERS"]),
        enqueue_wait_replicas=int(values["ENQUEUE_WAIT_REPLICAS"]),
        enqueue_wait_timeout_s=float(values["ENQUEUE_WAIT_TIMEOUT"]),
        embedded_dir=str(embedded_dir),
        metrics_token=token or None,
        batch_ttl_s=float(values["BATCH_TTL"]),
        batch_done_ttl_s=float(values["BATCH_DONE_TTL"]),
        batch_result_max_bytes=int(values["BATCH_RESULT_MAX_BYTES"]),
    )


def _queue_limits(value: Any) -> dict[str, int]:
    """The entries that are a queue name and a whole number >= 1; the
    others are the system check's to report (cogworker.E034)."""
    if not isinstance(value, dict):
        return {}
    return {
        q: n
        for q, n in value.items()
        if isinstance(q, str) and q and isinstance(n, int) and not isinstance(n, bool) and n >= 1
    }


def _queue_groups(value: Any) -> tuple[tuple[str, str], ...]:
    """``QUEUE_GROUPS`` turned round: (queue, group) pairs, sorted. A queue
    listed twice keeps its first group (E036 reports it)."""
    if not isinstance(value, dict):
        return ()
    pairs: dict[str, str] = {}
    for group, queues in value.items():
        if isinstance(group, str) and isinstance(queues, list | tuple):
            for queue in queues:
                if isinstance(queue, str):
                    pairs.setdefault(queue, group)
    return tuple(sorted(pairs.items()))


def group_of(queue: str, config: Config) -> str:
    """The group of ``queue``: the ``QUEUE_GROUPS`` entry listing it, else
    itself (a pure function of settings: every process computes it alone)."""
    for name, group in config.queue_groups:
        if name == queue:
            return group
    return queue


def _cpu_affinity(value: Any) -> str | tuple[int, ...] | None:
    """A list of CPUs as a tuple; anything but a list as it is (E028 says
    what is wrong with it)."""
    if isinstance(value, list | tuple):
        return tuple(value)
    return value if value is None else str(value)


def _reset(*, setting: str, **kwargs: Any) -> None:
    # The connection resets its client on the same signal (connection.py).
    if setting == "COGWORKER":
        get_config.cache_clear()


setting_changed.connect(_reset)
