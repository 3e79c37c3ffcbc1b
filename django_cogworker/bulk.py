"""The bytes of many payloads at once, for ``delay_many``.

``delay_many`` makes payloads that differ only in their head (``jid``,
``args``, ``kwargs``): every field past it is the very same object in all
of them (the job's name, queue and retry, one ``now``). Their shared part
is encoded once and each payload's JSON written from its head:

- :func:`encode_many` finds out payload by payload which fields are
  shared, whatever a client middleware did to them;
- :func:`encode_alike` is told: the client chain let the payloads through
  unchanged (``ClientChain.passes_unchanged``), so they are still as
  ``Job.many_payloads`` made them, and it only writes their heads.
  :class:`Encoded` carries them to the push with their bytes.

Both give, payload by payload, the bytes :func:`payload.encode` gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeGuard

from django_cogworker.escaping import utf8
from django_cogworker.payload import Payload, _encoder, encode

#: The first keys of a payload that ``Job.payload`` builds, in order.
_HEAD = ["jid", "job", "args", "kwargs"]


class Encoded(list[Payload]):
    """Payloads of one job made by ``Job.many_payloads`` and let through
    unchanged (one or more, so one queue), with their bytes (``raws``):
    the push writes these bytes."""

    def __init__(self, payloads: Sequence[Payload]) -> None:
        super().__init__(payloads)
        self.raws = encode_alike(payloads)


def bytes_of(payloads: list[Payload]) -> list[bytes]:
    """The payloads' bytes: those an :class:`Encoded` carries, else :func:`encode_many`'s."""
    return payloads.raws if isinstance(payloads, Encoded) else encode_many(payloads)


def encode_many(payloads: Iterable[Payload]) -> list[bytes]:
    """``[encode(p) for p in payloads]``, the same bytes, sooner for
    payloads whose fields past the head are the very same objects."""
    out, shared, text = [], None, ""
    for payload in payloads:
        items = list(payload.items())
        head, rest = items[:4], items[4:]
        jid = payload.get("jid")
        if [key for key, _ in head] != _HEAD or not _plain_jid(jid):
            out.append(encode(payload))
            continue
        ids = [id(part) for pair in items[1:2] + rest for part in pair]
        if ids != shared:
            if not all(type(key) is str for key, _ in rest):
                out.append(encode(payload))
                continue
            shared, job = ids, _encoder.encode(head[1][1])
            text = _tail(rest)
        out.append(_written(jid, job, head[2][1], head[3][1], text))
    return out


def encode_alike(payloads: Sequence[Payload]) -> list[bytes]:
    """:func:`encode_many` for payloads known to share every field past
    the head, as ``Job.many_payloads`` makes them: only each one's head is
    looked at."""
    if not payloads:
        return []
    items = list(payloads[0].items())
    if [key for key, _ in items[:4]] != _HEAD or not all(type(key) is str for key, _ in items[4:]):
        return encode_many(payloads)
    job, text = _encoder.encode(items[1][1]), _tail(items[4:])
    out = []
    for payload in payloads:
        jid = payload["jid"]
        if not _plain_jid(jid):
            out.append(encode(payload))
            continue
        out.append(_written(jid, job, payload["args"], payload["kwargs"], text))
    return out


def _plain_jid(jid: object) -> TypeGuard[str]:
    """Whether ``jid`` is written as it is between quotes (``new_jid``'s are)."""
    return type(jid) is str and jid.isascii() and jid.isalnum()


def _tail(rest: list[tuple[str, object]]) -> str:
    return "".join(f",{_encoder.encode(key)}:{_encoder.encode(value)}" for key, value in rest)


def _written(jid: str, job: str, args: object, kwargs: object, tail: str) -> bytes:
    args_text = "[]" if type(args) is list and not args else _encoder.encode(args)
    kwargs_text = "{}" if type(kwargs) is dict and not kwargs else _encoder.encode(kwargs)
    whole = f'{{"jid":"{jid}","job":{job},"args":{args_text},"kwargs":{kwargs_text}{tail}}}'
    try:
        return whole.encode()
    except UnicodeEncodeError:
        return utf8(whole)
