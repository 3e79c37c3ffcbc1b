"""What every check of ``COGWORKER`` shares: the shape of its errors."""

from __future__ import annotations

from django.core.checks import Error

NUMBER = (int, float)


def error(msg: str, hint: str, id_: str) -> Error:
    """An error about ``COGWORKER``: what is wrong, and what would be right."""
    return Error(msg, hint=hint, obj="COGWORKER", id=id_)
