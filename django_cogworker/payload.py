"""Payloads: the JSON objects that travel through Redis (SPEC section 4).

JSON only, never pickle. A payload carries at least ``jid``, ``job``,
``args``, ``kwargs``, ``queue``, ``retry``, ``created_at`` and
``enqueued_at``; a failure adds ``retry_count``, ``error_class``,
``error_message``, ``error_backtrace``, ``failed_at`` and ``retried_at``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from django_cogworker.errors import BadPayload

Payload = dict[str, Any]

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def new_jid() -> str:
    return secrets.token_hex(12)


def encode(payload: Payload) -> bytes:
    return _encoder.encode(payload).encode()


def check_arguments(job_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raises TypeError naming the first argument that JSON cannot carry."""
    for index, value in enumerate(args):
        _check_one(job_name, f"positional argument {index}", value)
    for key, value in kwargs.items():
        _check_one(job_name, f"argument {key!r}", value)


def _check_one(job_name: str, what: str, value: Any) -> None:
    try:
        _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} of job {job_name!r} is not JSON-serialisable ({type(value).__name__}: {exc}); "
            "pass plain JSON values (str, int, float, bool, None, list, dict), such as a model's pk"
        ) from None


def decode(raw: bytes | str) -> Payload:
    """The payload as a dict, or BadPayload saying what is wrong with it."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadPayload(f"payload is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadPayload(f"payload is a JSON {type(value).__name__}, not an object")
    name = value.get("job")
    if not isinstance(name, str) or not name:
        raise BadPayload("payload has no job name (a non-empty string under 'job')")
    if not isinstance(value.get("args", []), list):
        raise BadPayload("payload 'args' is not a list")
    if not isinstance(value.get("kwargs", {}), dict):
        raise BadPayload("payload 'kwargs' is not an object")
    if not isinstance(value.get("jid", ""), str):
        raise BadPayload("payload 'jid' is not a string")
    return value


def text(raw: bytes | str) -> str:
    """Raw bytes as text for people and for the ``raw`` field (never fails)."""
    return raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")


def salvage(raw: bytes | str) -> Payload:
    """What can be kept of an unreadable payload: the object itself if it is
    one, else a new object whose ``raw`` field holds the original text (G13)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        value = None
    if isinstance(value, dict):
        salvaged = dict(value)
        if not isinstance(salvaged.get("jid"), str):
            salvaged["jid"] = new_jid()
        return salvaged
    return {"jid": new_jid(), "raw": text(raw)}
