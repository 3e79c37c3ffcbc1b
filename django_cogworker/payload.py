"""Payloads: the JSON objects that travel through Redis (SPEC section 4).

JSON only, never pickle. A payload carries at least ``jid``, ``job``,
``args``, ``kwargs``, ``queue``, ``retry``, ``created_at`` and
``enqueued_at`` (``expires_at`` for a job with ``expires``, on Redis's clock:
:mod:`django_cogworker.expiry`); a failure adds ``retry_count``, ``error_class``,
``error_message``, ``error_backtrace``, ``failed_at`` and ``retried_at``.

Everything read from Redis is untrusted text: :func:`parse` is the one
place it becomes Python values, and it fails only with :class:`BadPayload`
(never RecursionError), so every reader can treat it as unreadable (G13).
Whatever a str holds, :func:`encode` writes it: a lone surrogate (from a
file name, or read from JSON's ``"\\udcff"``) as its JSON escape, which
reads back the same (``escaping.utf8``). What was read is written back by
:func:`encode_stored`, which never fails: a job whose filing failed would
stay in progress, and be run again and again (G13).
"""

from __future__ import annotations

import json
import json.scanner
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from json.encoder import encode_basestring
from typing import Any

from django_cogworker.errors import BadPayload
from django_cogworker.escaping import utf8

Payload = dict[str, Any]

#: The deepest nesting of lists and objects a payload may have, counting the
#: payload object itself. Python's json gives up (RecursionError) near its
#: recursion limit, 1,000 less the caller's own stack, and Redis's cjson at
#: 1,000 levels: under this bound a worker, an admin page rendering in a deep
#: view stack and a Lua script all read a payload alike, and re-encoding one
#: that was read never fails. ``.delay()`` refuses deeper arguments; a worker
#: files a deeper payload in dead as unreadable (G13).
MAX_DEPTH = 500

#: An argument sits two levels down in its payload (the object, then its
#: ``args`` list or ``kwargs`` object).
MAX_ARGUMENT_DEPTH = MAX_DEPTH - 2

#: A jid is this many random bytes, in hex.
JID_BYTES = 12

TOO_DEEP = f"nested too deeply to read (more than {MAX_DEPTH} levels of lists and objects)"

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
#: json's C encoder (None on a Python without it), which _encoder.encode
#: makes and calls for each payload.
_make_encoder: Callable[..., Callable[[Any, int], Sequence[str]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)
#: json's C scanner (None on a Python without it): what ``json.loads``
#: calls for a payload once it has found its encoding and skipped spaces.
_make_scanner: Callable[[json.JSONDecoder], Callable[[str, int], tuple[Any, int]]] | None = getattr(
    json.scanner, "c_make_scanner", None
)
_scan = None if _make_scanner is None else _make_scanner(json.JSONDecoder())

#: Jids read ahead from the system's random source, JID_POOL at a time:
#: ``.delay()`` after a pause paid a system call, run cold, for each one.
#: Forgotten in a forked child, which would otherwise hand out the parent's
#: next jids again.
JID_POOL = 256
_jids: Iterator[str] = iter(())


def new_jid() -> str:
    global _jids
    # A list's iterator hands each jid out once, whatever the threads.
    jid = next(_jids, None)
    if jid is None:
        _jids = iter(new_jids(JID_POOL))
        jid = next(_jids)
    return jid


def _forget_jids() -> None:
    global _jids
    _jids = iter(())


os.register_at_fork(after_in_child=_forget_jids)


def new_jids(count: int) -> list[str]:
    """``count`` jids, as :func:`new_jid` makes them, from one read of the
    system's random source (``delay_many``)."""
    width = 2 * JID_BYTES
    text = secrets.token_bytes(JID_BYTES * count).hex()
    return [text[start : start + width] for start in range(0, width * count, width)]


def encode(payload: Payload) -> bytes:
    """The payload as JSON in UTF-8, a lone surrogate as its escape. Raises
    ValueError for a number JSON cannot write (``.delay()`` refuses those
    first, naming the argument)."""
    if _make_encoder is None:
        text = _encoder.encode(payload)
    else:
        # What _encoder.encode(payload) runs, without its Python steps,
        # which .delay() runs cold after each pause. A fresh ``markers`` each
        # time, as there: a reference cycle raises ValueError.
        make = _make_encoder({}, _encoder.default, encode_basestring, None, ":", ",", False, False, False)
        text = "".join(make(payload, 0))
    try:
        return text.encode()  # utf8()'s first step, inline: .delay() pays no call more
    except UnicodeEncodeError:
        return utf8(text)


# A string of JSON text, or a number JSON cannot write (as json.dumps writes it).
_NON_FINITE = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN')
_AS_JSON = {"Infinity": "1e999", "-Infinity": "-1e999", "NaN": "null"}


def encode_stored(payload: Payload) -> bytes:
    """:func:`encode` for a payload that was read from Redis, which never
    fails: ``1e999`` reads as inf (Python's json also reads ``Infinity``
    and ``NaN``), and is written ``1e999`` again, which every JSON reader
    reads as infinite; NaN, which JSON has no way to write, as null. What
    :func:`parse` returns is never too deep to write (``MAX_DEPTH``)."""
    try:
        return encode(payload)
    except ValueError:
        loose = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
        return utf8(_NON_FINITE.sub(lambda m: _AS_JSON.get(m.group(0), m.group(0)), loose))


def check_arguments(job_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raises TypeError naming the first argument that JSON cannot carry, or
    that is nested deeper than ``MAX_ARGUMENT_DEPTH``."""
    for index, value in enumerate(args):
        _check_one(job_name, f"positional argument {index}", value)
    for key, value in kwargs.items():
        _check_one(job_name, f"argument {key!r}", value)


def check_shape(job_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raises TypeError naming the first argument that JSON would hand the
    job changed: a tuple (a list then), a dict key that is not a string.
    For ``@job``'s ``.delay()``; Django's Tasks define tuples to arrive as
    lists, so their backend does not call it."""
    for index, value in enumerate(args):
        if not isinstance(value, _SCALARS):
            _refuse_changed(job_name, f"positional argument {index}", value)
    for key, value in kwargs.items():
        if not isinstance(value, _SCALARS):
            _refuse_changed(job_name, f"argument {key!r}", value)


def _refuse_changed(job_name: str, what: str, value: Any) -> None:
    problem = _changes_shape(value)
    if problem:
        raise TypeError(
            f"{what} of job {job_name!r} {problem}, so the job would not receive what was passed; "
            "pass lists and dicts with string keys. Nothing was enqueued."
        )


def _check_one(job_name: str, what: str, value: Any) -> None:
    try:
        encoded = _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} of job {job_name!r} is not JSON-serialisable ({type(value).__name__}: {exc}); "
            "pass plain JSON values (str, int, float, bool, None, list, dict), such as a model's pk"
        ) from None
    except RecursionError:
        too_deep = True
    else:
        too_deep = _brackets(encoded) > MAX_ARGUMENT_DEPTH and _deeper_than(value, MAX_ARGUMENT_DEPTH)
    if too_deep:
        raise TypeError(
            f"{what} of job {job_name!r} is nested too deeply ({MAX_ARGUMENT_DEPTH} levels of lists and "
            "objects at most, so that every worker can read it); pass a flatter value"
        ) from None


_SCALARS = (str, int, float, bool, type(None))


def _changes_shape(value: Any) -> str:
    """What JSON would silently change in ``value``: a tuple comes back as
    a list, a dict's int key as a string (``{1: "a"}`` as ``{"1": "a"}``).
    "" when nothing. A loop: the value may be deep."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            return f"contains a tuple {_short(item)}, which JSON turns into a list"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return (
                        f"contains a dict key {key!r} ({type(key).__name__}), which JSON turns into "
                        f"the string {_encoder.encode({key: 0})[1:-3]}"
                    )
                if not isinstance(child, _SCALARS):
                    stack.append(child)
        elif isinstance(item, list):
            stack.extend(child for child in item if not isinstance(child, _SCALARS))
    return ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _brackets(data: bytes | str) -> int:
    """How many lists and objects the JSON text may open: a bound of its
    depth that costs no parsing (brackets inside strings count too)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists (tuples) and dicts nest more than ``limit`` levels in
    ``value``. A loop, not a recursion: the value may be deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return False


def parse(raw: bytes | str) -> Any:
    """JSON text read from Redis as Python values, or BadPayload saying why
    it cannot be read: not UTF-8, not JSON, or nested deeper than
    ``MAX_DEPTH`` (past about 1,000 levels Python's json raises
    RecursionError, which is untrusted input like any other)."""
    try:
        value = _loads(raw)
    except RecursionError:
        raise BadPayload(TOO_DEEP) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise BadPayload(f"not valid JSON: {exc}") from None
    if _brackets(raw) > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise BadPayload(TOO_DEEP)
    return value


def _loads(raw: bytes | str) -> Any:
    """``json.loads(raw)``, the same value or error, without its Python
    steps for text as our payloads are written: an object, first a key, in
    UTF-8 (``json.loads`` would find that encoding), nothing after it."""
    if _scan is not None and (raw[:2] == b'{"' if isinstance(raw, bytes) else raw[:2] == '{"'):
        try:
            text = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            value, end = _scan(text, 0)
        except (StopIteration, UnicodeDecodeError):
            pass  # not JSON: json.loads says why, in its own words
        else:
            if end == len(text):
                return value
    return json.loads(raw)


def decode(raw: bytes | str) -> Payload:
    """The payload as a dict, or BadPayload saying what is wrong with it."""
    try:
        value = parse(raw)
    except BadPayload as exc:
        raise BadPayload(f"payload is {exc}") from None
    return checked(value)


def checked(value: Any) -> Payload:
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
        value = parse(raw)
    except BadPayload:
        value = None
    if isinstance(value, dict):
        salvaged = dict(value)
        if not isinstance(salvaged.get("jid"), str):
            salvaged["jid"] = new_jid()
        return salvaged
    return {"jid": new_jid(), "raw": text(raw)}
