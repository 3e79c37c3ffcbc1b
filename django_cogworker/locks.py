"""Releasing a job's unique and periodic locks when it ends for good.

The locks themselves are taken by the unique-jobs and periodic features; a
lock is owned by a jid and deleted only by its owner, in one script.
"""

from __future__ import annotations

from typing import Any

from django_cogworker.connection import Client
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload


def release_owned(client: Client, key: str, jid: str) -> bool:
    from django_cogworker.scripts import script

    return bool(script("release_owned")(client, [key], [jid]))


def release_all(client: Client, keys: Keys, payload: Payload) -> None:
    jid = str(payload.get("jid", ""))
    keys = keys.for_payload(payload)
    digest = payload.get("unique_digest")
    if isinstance(digest, str) and digest:
        release_owned(client, keys.unique(digest), jid)
    pjid = payload.get("periodic_pjid")
    if isinstance(pjid, str) and pjid:
        release_owned(client, keys.periodic_running(pjid), jid)


__all__: list[Any] = ["release_all", "release_owned"]
