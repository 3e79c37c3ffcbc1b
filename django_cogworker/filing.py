"""Filing a failed job in retry or dead: ``file.lua``, for both fetches and
for the testing helpers.

Duties: take the job off its in-progress list in the same call, and only
if it is still there (a job that a shutdown or a recovery put back
meanwhile is not filed too, which would run it twice); trim the dead set
to DEAD_TIMEOUT and DEAD_MAX_JOBS when asked.
"""

from __future__ import annotations

import time
from typing import Any

from django_cogworker.conf import Config
from django_cogworker.keys import Keys
from django_cogworker.scripts import Arg, script


def file_job(
    client: Any,
    keys: Keys,
    config: Config,
    inprogress: str | None,
    raw: bytes,
    zset: str,
    score: float,
    payload: bytes,
    jid: str,
    trim: bool,
    *,
    extra: tuple[list[str], list[Arg]] | None = None,
) -> Any:
    """Files a failed job in retry or dead (``file.lua``), taking it off
    ``inprogress`` when given (reliable fetch: only if it is still there,
    G18), trimming the dead set to DEAD_TIMEOUT and DEAD_MAX_JOBS when
    ``trim``. The testing helpers file through here too. ``extra``: the
    KEYS and ARGV that free the job's limiter slots in the same call
    (``limits.state.release_args``); the reply is then ``file.lua``'s own."""
    bounds: list[Arg] = (
        [repr(time.time() - config.dead_timeout_s), str(config.dead_max_jobs)] if trim else ["", ""]
    )
    args: list[Arg] = [raw, repr(score), payload, "0" if inprogress is None else "1", *bounds]
    # Without a list, KEYS[1] is a name file.lua never touches (no list to take the job off).
    listed = inprogress if inprogress is not None else keys.inprogress("")
    script_keys = [listed, zset, keys.orphanings(jid)]
    if extra is not None:
        return script("file")(client, script_keys + extra[0], args + extra[1])
    return bool(script("file")(client, script_keys, args))
