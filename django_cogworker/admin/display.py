"""How the jobs pages show values: moments, durations, arguments, JSON.

Pure functions of what the API returned (no request, no Redis), so every
page reads a time, a job's arguments or a backtrace alike. What they return
is text for the templates, which escape it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils.timesince import timesince, timeuntil

from django_cogworker import api

#: Characters of an unreadable payload's raw text shown in a list.
UNREADABLE_PREVIEW_CHARS = 200


@dataclass(frozen=True)
class When:
    """A moment as the pages show it: a datetime and "3 minutes ago"."""

    at: dt.datetime
    relative: str

    @classmethod
    def of(cls, value: Any) -> When | None:
        """From epoch seconds (as payloads and Redis hold them), or None."""
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            at = dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (ValueError, OverflowError, OSError):
            return None
        now = dt.datetime.now(dt.UTC)
        seconds = (at - now).total_seconds()
        # timesince() counts in minutes at best: "0 minutes" tells nothing
        # about a beat that should come every few seconds.
        if abs(seconds) < 1:
            return cls(at, "just now")
        if abs(seconds) < 60:
            return cls(at, f"in {int(seconds)} s" if seconds > 0 else f"{int(-seconds)} s ago")
        if seconds > 0:
            return cls(at, "in " + timeuntil(at, now))
        return cls(at, timesince(at, now) + " ago")


def duration_text(seconds: float) -> str:
    """How long, for people: "0.4 s", "12 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def malformed_notes(*groups: Iterable[str]) -> list[str]:
    """The notes on what the API found malformed in Redis and skipped or
    read as a default (``skipped``, ``malformed`` of what it returned),
    each once, in order: several readings of one set give the same note."""
    return list(dict.fromkeys(note for group in groups for note in group))


def args_text(record: api.JobRecord) -> str:
    """A stored job's arguments on one line, or, when its payload cannot be
    read, the start of its raw text (shown as malformed, not a 500)."""
    if record.unreadable:
        return record.raw[:UNREADABLE_PREVIEW_CHARS]
    return json_line(record.args, record.kwargs)


@dataclass(frozen=True)
class Attempt:
    number: int
    started: When | None
    ran_for: str
    error: str


def attempts(payload: Any) -> tuple[list[Attempt], int]:
    """The failed attempts a payload remembers (``attempts``, written by the
    worker), oldest first, and how many of its entries were malformed."""
    entries = payload.get("attempts") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        return [], 0
    rows, malformed = [], 0
    for entry in entries:
        ran = entry.get("ran_s") if isinstance(entry, dict) else None
        if not isinstance(ran, int | float) or isinstance(ran, bool) or not 0 <= ran < 1e9:
            malformed += 1
            continue
        error = entry.get("error")
        ran_for = f"{ran:.3f} s" if ran < 10 else duration_text(ran)
        rows.append(Attempt(0, When.of(entry.get("started_at")), ran_for, str(error or "")))
    # Numbered from the latest: the payload keeps the last retry.ATTEMPTS_KEPT only.
    first = max(1, int(payload.get("retry_count") or 0) + 2 - len(rows)) if _is_count(payload) else 1
    return [Attempt(first + i, a.started, a.ran_for, a.error) for i, a in enumerate(rows)], malformed


def _is_count(payload: dict[str, Any]) -> bool:
    count = payload.get("retry_count")
    return isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 10**9


def job_details(record: api.JobRecord) -> dict[str, Any]:
    """What the job page (``job.html``) shows of a stored job, whichever
    list or set holds it."""
    timeline, malformed = attempts(record.payload)
    return {
        "record": record,
        "attempts": timeline,
        "attempts_malformed": malformed,
        "args_json": pretty_json(record.args),
        "kwargs_json": pretty_json(record.kwargs),
        "backtrace": backtrace_text(record.error_backtrace),
        "payload_json": pretty_json(record.payload),
        "raw": record.raw,
    }


def pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (ValueError, RecursionError) as exc:
        return f"(cannot be shown: {type(exc).__name__})"


def backtrace_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(line).rstrip("\n") for line in value)
    return "" if value is None else str(value)


def json_line(args: Any, kwargs: Any) -> str:
    """Arguments on one line, as a call reads: ``1, "x", template="y"``."""

    def one(value: Any) -> str:
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, RecursionError) as exc:
            return f"(cannot be shown: {type(exc).__name__})"

    parts = [one(a) for a in args] if isinstance(args, list) else [one(args)]
    if isinstance(kwargs, dict):
        parts += [f"{k}={one(v)}" for k, v in kwargs.items()]
    elif kwargs:
        parts.append(one(kwargs))
    return ", ".join(parts)
