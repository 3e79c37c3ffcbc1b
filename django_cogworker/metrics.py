"""Per-job metrics: what each job name ran, how often it failed, how long it
took (SPEC section 12).

Duties:

- :class:`Tally` aggregates in the worker's memory, per job name, the runs,
  failures, total execution time, a fixed-bucket histogram of execution
  times and the fastest and slowest run since the last beat. The heartbeat
  writes it in its own script call (no extra round trip per job, none per
  beat; ``lua/lib/add_metrics.lua``) with ``HINCRBY`` into the minute's
  hash ``N:metrics:<YYYY-MM-DDTHH:MM>`` (kept ``METRICS_TTL_S``) and into
  the cumulative ``N:metrics:totals`` (the Prometheus counters), the
  fastest and slowest as the minute's minimum and maximum.
- :func:`parse` reads such a hash back, skipping and counting what is
  malformed, and :class:`JobFigures` answers the questions the pages ask
  (mean, percentiles from the histogram, kept within the runs observed).

Field names in both hashes: ``<job>|r`` runs, ``<job>|f`` failures,
``<job>|us`` total execution time in microseconds, ``<job>|h<i>`` runs whose
time fell in bucket ``i`` of ``BUCKETS_S``; in the minute's hash only,
``<job>|lo`` and ``<job>|hi``, the fastest and slowest run (µs). A job's
figures land in the minute of the beat that carries them, as the processed
counters do.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Any

from django_cogworker.keys import Keys
from django_cogworker.scripts import script
from django_cogworker.stats import minute

#: Upper bounds of the execution-time histogram's buckets (s); the last
#: bucket, index len(BUCKETS_S), holds everything slower.
BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

#: How long a minute's hash is kept: the Metrics page looks back this far.
METRICS_TTL_S = 8 * 3600

#: The hours the Metrics page offers.
HOURS = (1, 2, 4, 8)

RUNS, FAILURES, TIME_US, BUCKET = "r", "f", "us", "h"
#: A minute's fastest and slowest run of a job (µs): kept as a minimum and
#: a maximum, in the minute's hash only.
FASTEST, SLOWEST = "lo", "hi"


def bucket_of(took_s: float) -> int:
    return bisect.bisect_left(BUCKETS_S, took_s)


#: Where a Tally row keeps each job's fastest and slowest run (µs), after
#: the runs, failures, total µs and the buckets.
_LO = 3 + len(BUCKETS_S) + 1
_HI = _LO + 1


class Tally:
    """A process's figures since the last beat. Not thread-safe: the
    ledger calls it under its own lock."""

    def __init__(self) -> None:
        #: job name -> [runs, failures, total µs, bucket counts..., fastest µs, slowest µs]
        self.jobs: dict[str, list[int]] = {}

    def add(self, name: str, took_s: float, failed: bool) -> None:
        us = int(took_s * 1_000_000)
        row = self.jobs.get(name)
        if row is None:
            row = self.jobs[name] = [0] * _LO + [us, us]
        row[0] += 1
        row[1] += failed
        row[2] += us
        row[3 + bucket_of(took_s)] += 1
        if us < row[_LO]:
            row[_LO] = us
        if us > row[_HI]:
            row[_HI] = us

    def merge(self, other: Tally) -> None:
        for name, counts in other.jobs.items():
            row = self.jobs.get(name)
            if row is None:
                self.jobs[name] = list(counts)
            else:
                for i in range(_LO):
                    row[i] += counts[i]
                row[_LO], row[_HI] = min(row[_LO], counts[_LO]), max(row[_HI], counts[_HI])

    def increments(self) -> list[str | int]:
        """Field, value pairs for ``lua/lib/add_metrics.lua``: the counts to
        add (the zeros left out), and each job's fastest and slowest run."""
        out: list[str | int] = []
        for name, row in self.jobs.items():
            for suffix, n in ((RUNS, row[0]), (FAILURES, row[1]), (TIME_US, row[2])):
                if n:
                    out += [f"{name}|{suffix}", n]
            for i, n in enumerate(row[3:_LO]):
                if n:
                    out += [f"{name}|{BUCKET}{i}", n]
            out += [f"{name}|{FASTEST}", row[_LO], f"{name}|{SLOWEST}", row[_HI]]
        return out

    def __bool__(self) -> bool:
        return bool(self.jobs)


def write(pipe: Any, keys: Keys, tally: Tally, at_s: float | None = None) -> None:
    """Adds ``tally``'s figures to a pipeline, as the heartbeat's script
    writes them (``add_metrics.lua``): for a process's last figures as it
    stops. EVAL, not EVALSHA: once per process, and a pipeline cannot
    retry a script the server does not hold."""
    increments = tally.increments()
    if not increments:
        return
    source = script("metrics").source
    # execute_command: a cluster pipeline's eval() is not Redis's EVAL.
    minute_key = keys.metrics_minute(minute(at_s))
    pipe.execute_command("EVAL", source, 2, minute_key, keys.metrics_totals, METRICS_TTL_S, *increments)


@dataclass
class JobFigures:
    """One job name's figures over some minutes. ``lo_us`` and ``hi_us``,
    the fastest and slowest run, are None when unknown for some of its runs
    (figures written by an older version)."""

    name: str
    runs: int = 0
    failures: int = 0
    time_us: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    lo_us: int | None = None
    hi_us: int | None = None

    @property
    def total_s(self) -> float:
        return self.time_us / 1_000_000

    @property
    def mean_s(self) -> float:
        return self.total_s / self.runs if self.runs else 0.0

    def add(self, other: JobFigures) -> None:
        if not self.runs:
            self.lo_us, self.hi_us = other.lo_us, other.hi_us
        elif other.runs:
            if self.lo_us is None or self.hi_us is None or other.lo_us is None or other.hi_us is None:
                self.lo_us = self.hi_us = None  # unknown for some runs: unknown
            else:
                self.lo_us, self.hi_us = min(self.lo_us, other.lo_us), max(self.hi_us, other.hi_us)
        self.runs += other.runs
        self.failures += other.failures
        self.time_us += other.time_us
        for i, n in enumerate(other.buckets):
            self.buckets[i] += n

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the execution time, estimated from the
        histogram, then kept between the fastest and the slowest run when
        they are known: no estimate above every run observed."""
        estimate = self._estimate(q)
        if self.lo_us is None or self.hi_us is None:
            return estimate
        return min(max(estimate, self.lo_us / 1_000_000), self.hi_us / 1_000_000)

    def _estimate(self, q: float) -> float:
        """Interpolated inside the bucket that holds the rank (the slowest
        bucket has no upper bound: its lower bound is answered)."""
        count = sum(self.buckets)
        if not count:
            return 0.0
        rank = q * count
        seen = 0
        for i, n in enumerate(self.buckets):
            if n and seen + n >= rank:
                if i >= len(BUCKETS_S):
                    return BUCKETS_S[-1]
                low = BUCKETS_S[i - 1] if i else 0.0
                return low + (BUCKETS_S[i] - low) * max(0.0, min(1.0, (rank - seen) / n))
            seen += n
        return BUCKETS_S[-1]


#: The largest integer Redis holds (signed 64 bits: INCRBY and HINCRBY
#: refuse to go past it); a counter read as larger is malformed.
MAX_COUNTER = 2**63 - 1

#: A figure's value as a worker writes it: a whole number of at most 19
#: ASCII digits (``int()`` would also take "+1", " 1", "1_0", the digits of
#: other scripts, and refuse 5,000 digits with a ValueError since 3.11).
_WHOLE = re.compile(rb"[0-9]{1,19}")


def _whole(value: bytes | str) -> int | None:
    raw = value if isinstance(value, bytes) else value.encode("ascii", "replace")
    if not _WHOLE.fullmatch(raw):
        return None
    n = int(raw)
    return n if n <= MAX_COUNTER else None


#: The kinds of field a worker writes, and the slot of each in a job's row:
#: exactly these, so that "h01", "h²" or a 5,000-digit index is malformed.
_SLOTS: dict[str, int] = {
    RUNS: 0,
    FAILURES: 1,
    TIME_US: 2,
    **{f"{BUCKET}{i}": 3 + i for i in range(len(BUCKETS_S) + 1)},
    FASTEST: _LO,
    SLOWEST: _HI,
}


def parse(raw: dict[bytes, bytes] | dict[str, str]) -> tuple[dict[str, JobFigures], int]:
    """A metrics hash as figures per job name, and how many of its fields
    were malformed (skipped: a field that is not ``<job>|<kind>`` with a
    kind a worker writes, or a value that is not a whole number a 64-bit
    counter holds). A job without its fastest or slowest run has None for
    it."""
    rows: dict[str, list[int]] = {}
    malformed = 0
    for key, value in raw.items():
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        name, _, kind = text.rpartition("|")
        n = _whole(value)
        slot = _SLOTS.get(kind)
        if not name or n is None or slot is None:
            malformed += 1
            continue
        row = rows.get(name)
        if row is None:
            row = rows[name] = [0] * _LO + [-1, -1]  # -1: not in the hash
        row[slot] = n if slot >= _LO else row[slot] + n
    jobs = {}
    for name, row in rows.items():
        lo_us, hi_us = row[_LO], row[_HI]
        jobs[name] = JobFigures(name, row[0], row[1], row[2], row[3:_LO], lo_us, hi_us)
        if lo_us < 0 or hi_us < 0:
            jobs[name].lo_us = jobs[name].hi_us = None
    return jobs, malformed


def bucket_label(index: int) -> str:
    """``≤ 25 ms``, ``≤ 2.5 s``, ``> 300 s``."""
    if index >= len(BUCKETS_S):
        return f"> {format_s(BUCKETS_S[-1])}"
    return f"≤ {format_s(BUCKETS_S[index])}"


def format_s(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s"
