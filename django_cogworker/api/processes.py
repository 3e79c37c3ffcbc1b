"""Live worker processes and the jobs running in them.

Duties: ``ProcessSet`` lists the live processes (those whose presence key is
still there) with what their heartbeat records: identity, hostname, pid,
tag, concurrency, busy, queues, quiet, last beat; and sends one "quiet" or
"stop", which it acts on at its next beat. ``Workers`` lists the jobs
running now, as each process's last beat summarised them (``RunningJob``,
a bounded summary, not the payload). ``InProgress`` reads one process's
in-progress list, read only: a job there is its process's alone (G2).
A malformed field is read as a default and named in the record's
``malformed``; an identity that is not UTF-8, or a hash of the wrong type,
is skipped with a note in the listing's ``skipped``: never an exception
(SPEC section 8). Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django_cogworker.api.parsing import (
    Fields,
    Listing,
    as_dict,
    as_list,
    field_text,
    is_wrong_type,
    loads_object,
    set_names,
)
from django_cogworker.api.records import JobRecord
from django_cogworker.api.sets import each_key
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.payload import Payload
from django_cogworker.shards import groups_known
from django_cogworker.summaries import args_preview, summary_field

#: How long an unread signal waits for its process (s).
SIGNAL_TTL_S = 3600


@dataclass
class ProcessRecord:
    identity: str
    hostname: str
    pid: int
    tag: str
    concurrency: int
    busy: int
    queues: list[str]
    quiet: bool
    started_at: float
    last_beat: float
    rss_kb: int
    fetch: str
    recovery: dict[str, Any]
    #: ``ASYNC_CONCURRENCY`` in a process running ``async def`` jobs, else
    #: 0: ``busy`` counts up to ``concurrency + async_concurrency`` (G19).
    async_concurrency: int = 0
    #: The fields that are malformed (name -> why), read as 0, [] or {}.
    malformed: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, identity: str, raw: dict[bytes, bytes]) -> ProcessRecord:
        """A process as its heartbeat hash ``raw`` records it."""
        f = Fields(
            {key.decode("utf-8", "replace"): value.decode("utf-8", "replace") for key, value in raw.items()}
        )
        return cls(
            identity=identity,
            hostname=f.get("hostname", ""),
            pid=f.number("pid", int),
            tag=f.get("tag", ""),
            concurrency=f.number("concurrency", int),
            busy=f.number("busy", int),
            queues=[str(q) for q in f.json("queues", [])],
            quiet=f.get("quiet") == "1",
            started_at=f.number("started_at", float),
            last_beat=f.number("beat", float),
            rss_kb=f.number("rss_kb", int),
            fetch=f.get("fetch", ""),
            recovery=f.json("recovery", {}),
            async_concurrency=f.number("async_concurrency", int),
            malformed=f.malformed,
        )

    def quiet_it(self) -> None:
        ProcessSet.signal(self.identity, "quiet")

    def stop_it(self) -> None:
        ProcessSet.signal(self.identity, "stop")


class ProcessSet:
    """Live worker processes (their presence key still there)."""

    def __iter__(self) -> Iterator[ProcessRecord]:
        yield from self.all()

    @redis_boundary("list the worker processes")
    def all(self) -> Listing[ProcessRecord]:
        k = get_keys()
        skipped: list[str] = []
        records = []
        for identity, raw in live_hashes(k.process, skipped, "its process is not listed"):
            if raw:  # else its presence key expired: not live
                records.append(ProcessRecord.of(identity, raw))
        return Listing(records, skipped)

    @property
    def size(self) -> int:
        return len(self.all())

    @staticmethod
    @redis_boundary("signal a worker process")
    def signal(identity: str, what: str) -> None:
        """Sends "quiet" or "stop" to a process; it acts at its next beat."""
        if what not in ("quiet", "stop"):
            raise ValueError(f"unknown signal {what!r}: use 'quiet' or 'stop'")
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.rpush(k.signals(identity), what)
        pipe.expire(k.signals(identity), SIGNAL_TTL_S)
        pipe.execute()

    @staticmethod
    @redis_boundary("read the last recovery report")
    def last_recovery() -> dict[str, Any]:
        raw = get_redis().get(get_keys().recovery_report)
        return (loads_object(raw) or {}) if raw else {}


@dataclass
class RunningJob:
    """A job running now, as its process's last beat summarised it (the
    ``N:workers`` record: a bounded summary, not the payload)."""

    identity: str
    jid: str
    queue: str
    run_at: float
    name: str = ""
    #: The arguments on one line, cut at ``summaries.ARGS_PREVIEW_CHARS``.
    args_preview: str = ""
    thread: int | None = None
    retry_count: int | None = None
    #: Why its payload cannot be read ("" when it can).
    unreadable: str = ""
    #: The fields of its record that are malformed (name -> why); a
    #: malformed ``run_at`` is read as 0.
    malformed: dict[str, str] = dataclasses.field(default_factory=dict)
    _payload: Payload | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, identity: str, jid: str, record: bytes) -> RunningJob:
        info = loads_object(record)
        if info is None:
            return cls(identity, jid, "", 0.0, unreadable="its record in Redis is unreadable")
        retry_count = info.get("retry_count")
        fields = Fields(info)
        common: dict[str, Any] = {
            "identity": identity,
            "jid": jid,
            "queue": str(info.get("queue") or ""),
            "run_at": fields.number("run_at", float),
            "thread": info["thread"] if type(info.get("thread")) is int else None,
            "malformed": fields.malformed,
        }
        if "payload" in info:
            # The shape written before summaries, by a process not yet
            # upgraded: the whole payload.
            payload = loads_object(str(info["payload"])) or {}
            retry_count = payload.get("retry_count")
            return cls(
                **common,
                name=str(payload.get("job") or ""),
                args_preview=args_preview(as_list(payload.get("args")), as_dict(payload.get("kwargs"))),
                retry_count=retry_count if type(retry_count) is int else None,
                unreadable="" if payload else "payload is not a readable JSON object",
                _payload=payload,
            )
        return cls(
            **common,
            name=str(info.get("job") or ""),
            args_preview=str(info.get("args_preview") or ""),
            retry_count=retry_count if type(retry_count) is int else None,
            unreadable=str(info.get("unreadable") or ""),
        )

    @property
    def payload(self) -> Payload:
        """The whole payload, read from the process's in-progress list when
        first asked for ({} once the job is no longer there, or under basic
        fetch, which keeps no such list)."""
        if self._payload is None:
            record = InProgress(self.identity).find(self.jid) if self.jid else None
            self._payload = dict(record.payload) if record is not None and not record.unreadable else {}
        return self._payload

    @property
    def running_for_s(self) -> float:
        return max(0.0, time.time() - self.run_at)


class Workers:
    """Jobs running now, as last reported by each live process's heartbeat."""

    def __iter__(self) -> Iterator[RunningJob]:
        yield from self.all()

    @redis_boundary("list the running jobs")
    def all(self) -> Listing[RunningJob]:
        skipped: list[str] = []
        jobs = []
        for identity, entries in live_hashes(get_keys().workers, skipped, "the jobs it runs are not listed"):
            for jid, record in (entries or {}).items():
                jobs.append(RunningJob.of(identity, jid.decode("utf-8", "replace"), record))
        return Listing(sorted(jobs, key=lambda j: j.run_at), skipped)

    @property
    def size(self) -> int:
        return len(self.all())


class InProgress:
    """One process's in-progress list (``N:inprogress:<identity>``): the jobs
    it fetched and has not finished, about ``CONCURRENCY`` of them. Read
    only: a job there is its process's alone (G2), so its records offer no
    action."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        keys = get_keys()
        # Under SHARDING its list is in the group it serves: each is looked at.
        self.key = (
            f"{{{keys.namespace}:*}}:inprogress:{identity}" if keys.sharded else keys.inprogress(identity)
        )
        self._lists = None if keys.sharded else [self.key]

    def __repr__(self) -> str:
        return f"<InProgress {self.identity}>"

    @property
    def lists(self) -> list[str]:
        if self._lists is None:
            self._lists = [g.inprogress(self.identity) for g in groups_known()]
        return self._lists

    @property
    @redis_boundary("read a process's in-progress jobs")
    def size(self) -> int:
        return sum(each_key(get_redis(), "llen", self.lists))

    def _entries(self) -> Iterator[tuple[str, bytes]]:
        for key in self.lists:
            with redis_boundary("read a process's in-progress jobs"):
                raws = get_redis().lrange(key, 0, -1)
            yield from ((key, raw) for raw in raws)

    def __iter__(self) -> Iterator[JobRecord]:
        for key, raw in self._entries():
            yield JobRecord(raw, source=key, kind="inprogress")

    def find(self, jid: str) -> JobRecord | None:
        """The job with this jid, or None (finished, or never here)."""
        for key, raw in self._entries():
            # Most entries are settled from the bytes: a large payload is
            # parsed only when it is likely the one.
            found = field_text(raw, "jid")
            if found is not None and not _names(found, jid):
                continue
            record = JobRecord(raw, source=key, kind="inprogress")
            if _names(record.jid, jid):
                return record
        return None


def _names(payload_jid: str, jid: str) -> bool:
    """Whether ``jid`` names the payload's jid: itself, or as its process's
    beat records it in ``N:workers`` (cut as a summary's field, a lone
    surrogate written as text: ``escaping.storable``)."""
    return jid in (payload_jid, storable(payload_jid), storable(summary_field(payload_jid)))


def live_hashes(
    key: Callable[[str], str], skipped: list[str], lost: str
) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    """Each registered process's hash at ``key(identity)``, read in one
    pipeline; one that is not a hash is named in ``skipped`` (``lost``
    says what is not listed because of it) and left out."""
    client = get_redis()
    identities = set_names(client, get_keys().processes, skipped)
    pipe = client.pipeline(transaction=False)
    for identity in identities:
        pipe.hgetall(key(identity))
    for identity, raw in zip(identities, pipe.execute(raise_on_error=False), strict=True):
        if is_wrong_type(raw):
            skipped.append(f"{key(identity)} is not a hash: {lost}")
        else:
            yield identity, raw
