"""What every check of ``COGWORKER`` shares: the shape of its errors, and
the suggestion for a name that is not known."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from django.core.checks import Error

NUMBER = (int, float)


def error(msg: str, hint: str, id_: str) -> Error:
    """An error about ``COGWORKER``: what is wrong, and what would be right."""
    return Error(msg, hint=hint, obj="COGWORKER", id=id_)


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """The end of a message about an unknown ``name``: ``"; did you mean
    'X'?"`` for the closest of ``known``, or ``"."`` when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else "."
