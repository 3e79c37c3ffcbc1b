"""What a heartbeat records of each running job (``N:workers``), and the
arguments on one line as the busy page shows them.

Duties: a summary small whatever the payload's size (the arguments are
encoded only as far as they are kept, so a 50 MB argument costs no more
than a small one), made without ever failing: an unreadable payload gets
``unreadable`` (why) and the start of its text.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from django_cogworker.errors import BadPayload
from django_cogworker.payload import checked, parse, text

#: Characters of a job's arguments kept in a :func:`summary` (what a
#: heartbeat records for each running job; the busy page shows it).
ARGS_PREVIEW_CHARS = 200

#: Characters kept of each text field (jid, job name, queue) of a summary.
SUMMARY_FIELD_CHARS = 200

#: Ends a preview or field that was cut short.
ELLIPSIS = "…"

# For people: whatever a payload holds (NaN included) can be shown.
_preview_encoder = json.JSONEncoder(ensure_ascii=False, default=repr)


def summary(raw: bytes | str) -> dict[str, Any]:
    """A running job as its process's heartbeat records it (``N:workers``):
    ``jid``, ``job``, ``queue``, ``retry_count`` (when the payload has one)
    and ``args_preview``, the arguments on one line cut at
    ``ARGS_PREVIEW_CHARS``. Small whatever the payload's size, and never
    fails: an unreadable payload gets ``unreadable`` (why) and the start of
    its text as the preview."""
    try:
        value = parse(raw)
    except BadPayload as exc:
        return _unreadable(raw, {}, f"payload is {exc}")
    try:
        payload = checked(value)
    except BadPayload as exc:
        return _unreadable(raw, value if isinstance(value, dict) else {}, str(exc))
    about: dict[str, Any] = {
        "jid": summary_field(payload.get("jid")),
        "job": summary_field(payload["job"]),
        "queue": summary_field(payload.get("queue")),
        "args_preview": args_preview(payload.get("args", []), payload.get("kwargs", {})),
    }
    retry_count = payload.get("retry_count")
    if isinstance(retry_count, int) and not isinstance(retry_count, bool):
        about["retry_count"] = retry_count
    return about


def _unreadable(raw: bytes | str, found: dict[str, Any], why: str) -> dict[str, Any]:
    start = raw[: ARGS_PREVIEW_CHARS * 4]  # a character is at most 4 bytes of UTF-8
    return {
        "jid": summary_field(found.get("jid")),
        "job": summary_field(found.get("job")),
        "queue": summary_field(found.get("queue")),
        "unreadable": why,
        "args_preview": _cut(text(start), ARGS_PREVIEW_CHARS, cut=len(start) < len(raw)),
    }


def args_preview(args: Sequence[Any], kwargs: dict[str, Any], limit: int = ARGS_PREVIEW_CHARS) -> str:
    """Arguments on one line, as a call reads (``1, "x", key="y"``), cut at
    ``limit`` characters and then ending in ``ELLIPSIS``. Encodes only what
    it keeps: a 50 MB argument costs no more than a small one."""
    try:
        pieces: list[str] = []
        size = 0
        items = itertools.chain(
            (("", value) for value in args), ((f"{key}=", value) for key, value in kwargs.items())
        )
        for prefix, value in items:
            piece = (", " if pieces else "") + prefix + _head(value, limit - size + 1)
            pieces.append(piece)
            size += len(piece)
            if size > limit:
                break
        return _cut("".join(pieces), limit)
    except Exception as exc:
        return f"(the arguments cannot be shown: {type(exc).__name__})"


def _head(value: Any, budget: int) -> str:
    """The start of ``value`` as JSON: at least ``budget`` characters when it
    is that long, else all of it."""
    if isinstance(value, str) and len(value) > budget:
        value = value[:budget]  # its JSON is longer still: cut either way
    chunks: list[str] = []
    size = 0
    # iterencode (not encode) yields the text a piece at a time: stop early.
    for chunk in _preview_encoder.iterencode(value):
        chunks.append(chunk)
        size += len(chunk)
        if size > budget:
            break
    return "".join(chunks)


def summary_field(value: Any) -> str:
    """A text field of a summary: cut at ``SUMMARY_FIELD_CHARS``, "" if not a str."""
    return _cut(value, SUMMARY_FIELD_CHARS) if isinstance(value, str) else ""


def _cut(value: str, limit: int, *, cut: bool = False) -> str:
    if len(value) > limit:
        return value[:limit] + ELLIPSIS
    return value + ELLIPSIS if cut else value
