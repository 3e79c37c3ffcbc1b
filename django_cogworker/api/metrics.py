"""Per-job metrics as stored by the workers (``django_cogworker.metrics``).

Duties: ``totals()`` reads the cumulative figures of every job name (one
HGETALL, for the Prometheus endpoint); ``minutes(hours)`` reads the
per-minute hashes of the last hours (one pipelined round trip of HGETALLs,
at most 60 per hour). A malformed field is skipped and counted, a key of
the wrong type is read as empty: never an exception (SPEC section 8).
``mark_deploy(label)`` stores a deploy mark (the charts draw a line at
it) and trims the marks older than the metrics; ``deploy_marks(start,
end)`` reads those in a range, skipping an unreadable member with a note.
Redis errors reach the caller as ``CogworkerError``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import redis

from django_cogworker import metrics
from django_cogworker.api.parsing import Listing, is_wrong_type, loads_object, quoted
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.metrics import JobFigures
from django_cogworker.stats import minute


@dataclass
class Totals:
    jobs: dict[str, JobFigures]
    #: Fields skipped as malformed.
    malformed: int = 0


@dataclass
class Minute:
    #: The minute's start (epoch seconds, UTC).
    at: float
    jobs: dict[str, JobFigures]
    malformed: int = 0


@redis_boundary("read the job metrics")
def totals() -> Totals:
    try:
        raw = get_redis().hgetall(get_keys().metrics_totals)
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        raw = {}
    jobs, malformed = metrics.parse(raw)
    return Totals(jobs, malformed)


@redis_boundary("read the job metrics")
def minutes(hours: float = 1, *, now: float | None = None) -> list[Minute]:
    """The last ``hours`` of minutes, oldest first, the current one
    included (a minute without a hash: no job ended in it)."""
    now = time.time() if now is None else now
    start = int(now // 60) * 60
    count = max(1, int(hours * 60))
    ats = [start - 60 * i for i in range(count - 1, -1, -1)]
    k = get_keys()
    pipe = get_redis().pipeline(transaction=False)
    for at in ats:
        pipe.hgetall(k.metrics_minute(minute(at)))
    out = []
    for at, raw in zip(ats, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, Exception):
            if not is_wrong_type(raw):
                raise raw
            raw = {}
        jobs, malformed = metrics.parse(raw)
        out.append(Minute(float(at), jobs, malformed))
    return out


def summed(window: list[Minute]) -> dict[str, JobFigures]:
    """Each job name's figures over the minutes of ``window``."""
    out: dict[str, JobFigures] = {}
    for m in window:
        for name, figures in m.jobs.items():
            out.setdefault(name, JobFigures(name)).add(figures)
    return out


#: Characters of a deploy mark's label kept.
MARK_LABEL_CHARS = 200


def label_text(label: str) -> str:
    """``label`` as text a page can encode: a lone surrogate (a byte that
    was not UTF-8 in a command's argument, ``"\\ud800"`` in JSON) becomes
    its escape, ``\\udcff``. Without it, the page's UTF-8 encoding fails:
    a 500 on every Metrics page until the mark ages out."""
    return label.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class DeployMark:
    #: When (epoch seconds).
    at: float
    label: str


@redis_boundary("store a deploy mark")
def mark_deploy(label: str, at: float | None = None) -> DeployMark:
    """Marks a deploy (or any event) at ``at`` (epoch seconds, now by
    default): the Metrics pages draw a line there, ``label`` as its
    tooltip. Marks older than the metrics themselves (``METRICS_TTL_S``)
    are removed in the same round trip, so the set stays small."""
    if not isinstance(label, str):
        raise TypeError(f"mark_deploy: the label must be a string, not {type(label).__name__}")
    now = time.time()
    at = now if at is None else float(at)
    if not math.isfinite(at):
        raise ValueError(f"mark_deploy: at must be epoch seconds, not {at!r}")
    mark = DeployMark(at, label_text(label)[:MARK_LABEL_CHARS])
    key = get_keys().deploy_marks
    pipe = get_redis().pipeline(transaction=False)
    # The time is in the member too: two deploys of one label stay two marks.
    pipe.zadd(key, {json.dumps({"label": mark.label, "at": mark.at}): mark.at})
    pipe.zremrangebyscore(key, "-inf", f"({now - metrics.METRICS_TTL_S}")
    pipe.execute()
    return mark


@redis_boundary("read the deploy marks")
def deploy_marks(start: float, end: float) -> Listing[DeployMark]:
    """The marks from ``start`` to ``end`` (epoch seconds), oldest first; a
    member that is not a mark (not JSON, no text label) is skipped with a
    note, and so is the whole set when its key is of another type."""
    key = get_keys().deploy_marks
    try:
        members = get_redis().zrangebyscore(key, start, end, withscores=True)
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):  # raises any other error
            raise
        return Listing([], [f"{key} is not a sorted set: no deploy marks shown"])
    marks: Listing[DeployMark] = Listing()
    for raw, score in members:
        found = loads_object(raw)
        label = found.get("label") if found is not None else None
        if isinstance(label, str) and math.isfinite(score):
            # Escaped here too: a label stored by an older version may hold one.
            marks.append(DeployMark(float(score), label_text(label)[:MARK_LABEL_CHARS]))
        else:
            marks.skipped.append(f"{key}: {quoted(raw)} is not a deploy mark: skipped")
    return marks
