"""The inspection API: what the admin pages (and operators' scripts) use.

``Queue``, ``ScheduledSet``, ``RetrySet``, ``DeadSet``, ``UnsettledSet``,
``JobRecord`` (with ``retry()``, ``delete()``, ``kill()``), ``ProcessSet``,
``Workers``, ``InProgress``, ``Stats`` and ``PeriodicEntries``. No view
builds a key or runs a Redis command itself. Every move is one script that
writes before it removes and does nothing if someone else moved the entry
first. Whatever Redis holds is read through ``payload.parse``: an entry
that cannot be read (not JSON, nested thousands deep) is shown as
unreadable, never an exception (SPEC section 8).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import math
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import BadPayload
from django_cogworker.payload import Payload, args_preview, encode, parse, text
from django_cogworker.scripts import script

PAGE_SIZE = 25

#: What can be done to a job in a set, one by one or in bulk (``bulk()``).
ACTIONS = ("retry", "delete", "kill")

#: Entries moved per pipeline round trip by ``bulk()``.
BULK_BATCH_SIZE = 500


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def _glob_literal(value: str, *, fold_case: bool = False) -> str:
    """A glob fragment that every JSON encoding of ``value`` (inside a
    string) matches, as a prefilter that is checked exactly afterwards. A
    character that JSON may write escaped (a quote, backslash, slash or
    control character, or any non-ASCII one, which another client may write
    as ``\\uXXXX``) becomes ``*``; byte-wise globbing could not bracket a
    multi-byte character anyway."""
    parts = []
    for c in value:
        if fold_case and c.isascii() and c.isalpha():
            parts.append(f"[{c.lower()}{c.upper()}]")
        elif not c.isascii() or c in '"\\/' or ord(c) < 0x20:
            parts.append("*")
        else:
            parts.append(_glob_escape(c))
    return "".join(parts)


def _loads(raw: bytes | str) -> Payload | None:
    """The JSON object stored, or None when it is not one or cannot be read."""
    try:
        value = parse(raw)
    except BadPayload:
        return None
    return value if isinstance(value, dict) else None


def _json_field(raw: str, default: Any) -> Any:
    """A JSON field of a process hash, or ``default`` when it is unreadable
    or of another type than ``default``."""
    try:
        value = parse(raw)
    except BadPayload:
        return default
    return value if isinstance(value, type(default)) else default


def _number(raw: Any, kind: type[int] | type[float]) -> Any:
    """A number field of a process hash; 0 when malformed (shown, not a 500)."""
    try:
        value = kind(raw or 0)
    except (TypeError, ValueError, OverflowError):
        return kind(0)
    return value if math.isfinite(value) else kind(0)


def _string_field(field: str) -> re.Pattern[bytes]:
    return re.compile(b'"' + field.encode() + rb'"\s*:\s*"((?:[^"\\]|\\.)*)"')


_STRING_FIELDS = {f: _string_field(f) for f in ("jid", "job", "queue", "error_class", "error_message")}


def _field_text(raw: bytes, field: str) -> str | None:
    """The string value of ``field`` read from the bytes when the name occurs
    once (as a string key); "" when it does not occur; None when unsure (it
    occurs several times, or its value is not a string)."""
    occurrences = raw.count(b'"' + field.encode() + b'"')
    if occurrences == 0:
        return ""
    found = _STRING_FIELDS[field].findall(raw)
    if occurrences > 1 or len(found) != 1:
        return None
    value = found[0]
    try:
        return json.loads(b'"' + value + b'"') if b"\\" in value else value.decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _quick_match(raw: bytes, *, name: str | None, queue: str | None, search: str | None) -> bool | None:
    """``JobRecord.matches`` decided from the bytes, where a field can be read
    without parsing the payload; None when unsure (then the caller parses)."""
    for field, wanted in (("job", name), ("queue", queue)):
        if wanted:
            value = _field_text(raw, field)
            if value is None:
                return None
            if value != wanted:
                return False
    if search:
        needle = search.lower()
        values = [_field_text(raw, f) for f in ("jid", "error_message", "error_class")]
        if any(v is None for v in values):
            return None
        return any(needle in str(v).lower() for v in values)
    return True


class JobRecord:
    """One job as stored: in a queue, a sorted set, or the unsettled list."""

    def __init__(
        self,
        raw: bytes,
        *,
        source: str,
        kind: str,
        score: float | None = None,
        payload_raw: bytes | None = None,
        target_set: str | None = None,
    ) -> None:
        self._raw = raw  # the entry exactly as stored (needed to move it)
        self.source = source  # the Redis key it is in
        self.kind = kind  # "queue", "zset", "unsettled", or "inprogress" (running: no actions)
        self.score = score
        self.target_set = target_set  # unsettled: where it should be filed
        self.payload_raw = payload_raw if payload_raw is not None else raw
        #: Why the payload cannot be read ("" when it can); then ``payload``
        #: is ``{"raw": <its text>}``.
        self.unreadable = ""
        value: Any = None
        try:
            value = parse(self.payload_raw)
        except BadPayload as exc:
            self.unreadable = f"payload is {exc}"
        else:
            if not isinstance(value, dict):
                self.unreadable = f"payload is a JSON {type(value).__name__}, not an object"
        self.payload: Payload = value if isinstance(value, dict) else {"raw": text(self.payload_raw)}

    def __repr__(self) -> str:
        return f"<JobRecord {self.jid} {self.name} in {self.source}>"

    @property
    def raw(self) -> str:
        return text(self.payload_raw)

    @property
    def entry(self) -> bytes:
        return self._raw

    def _get(self, key: str, default: Any = None) -> Any:
        return self.payload.get(key, default)

    jid = property(lambda self: str(self._get("jid", "")))
    name = property(lambda self: str(self._get("job", "")))
    args = property(lambda self: self._get("args", []))
    kwargs = property(lambda self: self._get("kwargs", {}))
    queue = property(lambda self: str(self._get("queue", "") or ""))
    retry_count = property(lambda self: self._get("retry_count"))
    error_class = property(lambda self: self._get("error_class"))
    error_message = property(lambda self: self._get("error_message"))
    error_backtrace = property(lambda self: self._get("error_backtrace"))
    failed_at = property(lambda self: self._get("failed_at"))
    retried_at = property(lambda self: self._get("retried_at"))
    enqueued_at = property(lambda self: self._get("enqueued_at"))
    created_at = property(lambda self: self._get("created_at"))

    @property
    def at(self) -> dt.datetime | None:
        """When it is due (scheduled, retry) or died (dead), as a datetime."""
        return None if self.score is None else dt.datetime.fromtimestamp(self.score, tz=dt.UTC)

    def matches(
        self, *, name: str | None = None, queue: str | None = None, search: str | None = None
    ) -> bool:
        if name and self.name != name:
            return False
        if queue and self.queue != queue:
            return False
        if search:
            needle = search.lower()
            hay = [self.jid, str(self.error_message or ""), str(self.error_class or "")]
            if not any(needle in h.lower() for h in hay):
                return False
        return True

    @property
    def id(self) -> str:
        """A token that finds this exact entry again through its set's
        ``get()``: ``<score>~<jid>`` in a sorted set (one ZRANGEBYSCORE away,
        however large the set), a digest of the entry in a list."""
        if self.kind == "zset":
            return f"{self.score!r}~{self.jid}"
        return hashlib.sha1(self._raw).hexdigest()[:20]

    # -- actions ---------------------------------------------------------------

    def _move_call(
        self, destination: str, payload: bytes, to_kind: str, where: str | float
    ) -> tuple[list[str], list[str | bytes]]:
        k = get_keys()
        source_kind = "zset" if self.kind == "zset" else "list"
        return (
            [self.source, destination, k.queues],
            [self._raw, payload, source_kind, to_kind, str(where)],
        )

    def _retry_call(self) -> tuple[list[str], list[str | bytes]] | None:
        if self.kind in ("queue", "inprogress"):
            return None
        payload = dict(self.payload)
        queue = (
            payload.get("queue")
            if isinstance(payload.get("queue"), str) and payload.get("queue")
            else "default"
        )
        payload["enqueued_at"] = time.time()
        data = encode(payload) if "job" in payload else self.payload_raw
        return self._move_call(get_keys().queue(str(queue)), data, "queue", str(queue))

    def _kill_call(self) -> tuple[list[str], list[str | bytes]] | None:
        k = get_keys()
        if self.kind == "inprogress" or (self.kind == "zset" and self.source == k.dead):
            return None
        payload = dict(self.payload)
        payload.setdefault("error_class", "Killed")
        payload.setdefault("error_message", "killed by hand")
        payload["failed_at"] = payload.get("failed_at") or time.time()
        return self._move_call(k.dead, encode(payload), "zset", repr(time.time()))

    def _call(self, action: str) -> tuple[list[str], list[str | bytes]] | None:
        return self._retry_call() if action == "retry" else self._kill_call()

    def _queue_action(self, pipe: Any, action: str) -> bool:
        """Adds ``action`` on this entry to a pipeline; False if it does not apply."""
        if action == "delete":
            if self.kind == "inprogress":
                return False
            if self.kind == "zset":
                pipe.zrem(self.source, self._raw)
            else:
                pipe.lrem(self.source, 1, self._raw)
            return True
        call = self._call(action)
        if call is None:
            return False
        script("move").queue(pipe, *call)
        return True

    def retry(self) -> bool:
        """Back on its queue now (from schedule, retry, dead or unsettled)."""
        call = self._retry_call()
        return call is not None and bool(script("move")(get_redis(), *call))

    def kill(self) -> bool:
        """To the dead set now."""
        call = self._kill_call()
        return call is not None and bool(script("move")(get_redis(), *call))

    def delete(self) -> bool:
        client = get_redis()
        if self.kind == "inprogress":
            return False  # running: G2 gives it to its process alone
        if self.kind == "zset":
            return bool(client.zrem(self.source, self._raw))
        return bool(client.lrem(self.source, 1, self._raw))

    def apply(self, action: str) -> bool:
        """One of ``ACTIONS`` by name; False if the entry was gone (or it is dead and asked to die)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
        return bool(getattr(self, action)())


def bulk(records: Iterable[JobRecord], action: str) -> int:
    """Applies one of ``ACTIONS`` to every record, ``BULK_BATCH_SIZE`` per
    round trip; returns how many entries were moved or deleted. Entries that
    someone else moved first are skipped (each move checks its source)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
    client = get_redis()
    script("move").ensure_loaded(client)
    done = 0
    iterator = iter(records)
    while chunk := list(itertools.islice(iterator, BULK_BATCH_SIZE)):
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            queued = [r._queue_action(pipe, action) for r in chunk]
            if not any(queued):
                break
            try:
                done += sum(1 for reply in pipe.execute() if reply)
                break
            except NoScriptError:
                # The server lost its scripts between the load and this batch
                # (restart, failover). Replaying is safe: moves already done
                # find their entry gone and return 0.
                if attempt == 2:
                    raise
                script("move").ensure_loaded(client)
    return done


def job_names() -> list[str]:
    """The registered job names (what a list can be filtered by)."""
    from django_cogworker import registry

    return registry.names()


# -- queues ---------------------------------------------------------------------


class Queue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.key = get_keys().queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name}>"

    @classmethod
    def all(cls) -> list[Queue]:
        names = {m.decode() for m in get_redis().smembers(get_keys().queues)}
        return [cls(n) for n in sorted(names)]

    @property
    def size(self) -> int:
        return int(get_redis().llen(self.key))

    @property
    def latency(self) -> float:
        """Seconds the oldest job has waited (0 when empty)."""
        oldest = get_redis().lindex(self.key, -1)
        if oldest is None:
            return 0.0
        payload = _loads(oldest) or {}
        at = payload.get("enqueued_at")
        return max(0.0, time.time() - float(at)) if isinstance(at, int | float) else 0.0

    @property
    def paused(self) -> bool:
        return bool(get_redis().sismember(get_keys().paused, self.name))

    def pause(self) -> None:
        get_redis().sadd(get_keys().paused, self.name)

    def unpause(self) -> None:
        get_redis().srem(get_keys().paused, self.name)

    def clear(self) -> int:
        """Deletes every job in the queue; returns how many. The queue stays
        known (listed by ``Queue.all()``, with size 0)."""
        pipe = get_redis().pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])

    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        """Jobs in the order they will run (next first)."""
        end = -1 - offset
        start = end - limit + 1
        raws = get_redis().lrange(self.key, start, end)
        return [JobRecord(r, source=self.key, kind="queue") for r in reversed(raws)]

    def __iter__(self) -> Iterator[JobRecord]:
        offset = 0
        while True:
            batch = self.page(offset, 500)
            yield from batch
            if len(batch) < 500:
                return
            offset += 500

    def find(self, jid: str) -> JobRecord | None:
        return next((r for r in self if r.jid == jid), None)


# -- sorted sets ------------------------------------------------------------------


class SortedSet:
    key_name = ""
    newest_first = False

    def __init__(self) -> None:
        self.key = getattr(get_keys(), self.key_name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key}>"

    @property
    def size(self) -> int:
        return int(get_redis().zcard(self.key))

    def _record(self, raw: bytes, score: float) -> JobRecord:
        return JobRecord(raw, source=self.key, kind="zset", score=float(score))

    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        client = get_redis()
        fn = client.zrevrange if self.newest_first else client.zrange
        return [self._record(r, s) for r, s in fn(self.key, offset, offset + limit - 1, withscores=True)]

    def __iter__(self) -> Iterator[JobRecord]:
        offset = 0
        while True:
            batch = self.page(offset, 500)
            yield from batch
            if len(batch) < 500:
                return
            offset += 500

    @staticmethod
    def _pattern(name: str | None, queue: str | None, search: str | None) -> str:
        # ``*`` after each colon: another client may write a space there.
        if name:
            return f'*"job":*"{_glob_literal(name)}"*'
        if search:
            return f"*{_glob_literal(search, fold_case=True)}*"
        if queue:
            return f'*"queue":*"{_glob_literal(queue)}"*'
        return "*"

    def _candidates(
        self, name: str | None, queue: str | None, search: str | None
    ) -> list[tuple[float, bytes, bool]]:
        """(score, entry, sure) of the entries that may match, in the set's
        order. ZSCAN's pattern narrows them on the server; ``_quick_match``
        settles most of the rest from the bytes (``sure``) without parsing."""
        found = []
        for raw, score in get_redis().zscan_iter(
            self.key, match=self._pattern(name, queue, search), count=1000
        ):
            quick = _quick_match(raw, name=name, queue=queue, search=search)
            if quick is None:
                if self._record(raw, score).matches(name=name, queue=queue, search=search):
                    found.append((float(score), raw, True))
            elif quick:
                found.append((float(score), raw, False))
        # Ties broken by the entry, as Redis orders equal scores.
        found.sort(key=lambda c: (c[0], c[1]), reverse=self.newest_first)
        return found

    def filter(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Entries matching every given criterion (``search`` looks in the jid
        and the error). Uses ZSCAN with a server-side pattern, so a large set
        is not read whole into Python."""
        found: list[JobRecord] = []
        for score, raw, _ in self._candidates(name, queue, search):
            record = self._record(raw, score)
            if record.matches(name=name, queue=queue, search=search):
                found.append(record)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def filter_page(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        offset: int = 0,
        limit: int = PAGE_SIZE,
    ) -> tuple[int, list[JobRecord]]:
        """(how many match, the page at ``offset``): what a paginated list
        needs, without parsing every match of a large set. Every record
        returned matches exactly; the count may include an entry whose field
        sits only inside a nested object (a payload of the wrong shape)."""
        candidates = self._candidates(name, queue, search)
        page = [self._record(raw, score) for score, raw, _ in candidates[offset : offset + limit]]
        return len(candidates), [r for r in page if r.matches(name=name, queue=queue, search=search)]

    def find(self, jid: str) -> JobRecord | None:
        pattern = f'*"jid":{_glob_escape(json.dumps(jid))}*'
        for raw, score in get_redis().zscan_iter(self.key, match=pattern, count=1000):
            record = self._record(raw, score)
            if record.jid == jid:
                return record
        return None

    def get(self, record_id: str) -> JobRecord | None:
        """The entry whose ``JobRecord.id`` is ``record_id``, or None."""
        score_text, sep, jid = record_id.partition("~")
        try:
            score = float(score_text)
        except ValueError:
            return None
        if not sep or math.isnan(score):
            return None
        bound = repr(score)
        for raw, s in get_redis().zrangebyscore(self.key, bound, bound, withscores=True):
            record = self._record(raw, s)
            if record.jid == jid:
                return record
        return None

    def clear(self) -> int:
        pipe = get_redis().pipeline(transaction=True)
        pipe.zcard(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])

    def job_names(self) -> list[str]:
        return sorted({r.name for r in self})


class ScheduledSet(SortedSet):
    key_name = "schedule"


class RetrySet(SortedSet):
    key_name = "retry"


class DeadSet(SortedSet):
    key_name = "dead"
    newest_first = True


# -- unsettled ----------------------------------------------------------------------


class UnsettledSet:
    """Failed jobs a stopping process could not file; any live process files them."""

    def __init__(self) -> None:
        self.key = get_keys().unsettled

    @property
    def size(self) -> int:
        return int(get_redis().llen(self.key))

    def _record(self, raw: bytes) -> JobRecord:
        entry = _loads(raw) or {}
        payload = entry.get("payload")
        payload_raw = payload.encode() if isinstance(payload, str) else raw
        score = entry.get("score")
        return JobRecord(
            raw,
            source=self.key,
            kind="unsettled",
            payload_raw=payload_raw,
            score=float(score) if isinstance(score, int | float) else None,
            target_set=entry.get("set"),
        )

    def page(self, offset: int = 0, limit: int = PAGE_SIZE) -> list[JobRecord]:
        return [self._record(r) for r in get_redis().lrange(self.key, offset, offset + limit - 1)]

    def __iter__(self) -> Iterator[JobRecord]:
        for raw in get_redis().lrange(self.key, 0, -1):
            yield self._record(raw)

    def filter(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        found = [r for r in self if r.matches(name=name, queue=queue, search=search)]
        return found[:limit] if limit is not None else found

    def filter_page(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        offset: int = 0,
        limit: int = PAGE_SIZE,
    ) -> tuple[int, list[JobRecord]]:
        """(how many match, the page at ``offset``), as ``SortedSet.filter_page``."""
        found = self.filter(name=name, queue=queue, search=search)
        return len(found), found[offset : offset + limit]

    def find(self, jid: str) -> JobRecord | None:
        return next((r for r in self if r.jid == jid), None)

    def get(self, record_id: str) -> JobRecord | None:
        """The entry whose ``JobRecord.id`` is ``record_id``, or None."""
        return next((r for r in self if r.id == record_id), None)

    def clear(self) -> int:
        pipe = get_redis().pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])


# -- processes, workers, stats -----------------------------------------------------


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

    def quiet_it(self) -> None:
        ProcessSet.signal(self.identity, "quiet")

    def stop_it(self) -> None:
        ProcessSet.signal(self.identity, "stop")


class ProcessSet:
    """Live worker processes (their presence key still there)."""

    def __iter__(self) -> Iterator[ProcessRecord]:
        yield from self.all()

    def all(self) -> list[ProcessRecord]:
        client, k = get_redis(), get_keys()
        identities = sorted(m.decode() for m in client.smembers(k.processes))
        pipe = client.pipeline(transaction=False)
        for identity in identities:
            pipe.hgetall(k.process(identity))
        records = []
        for identity, raw in zip(identities, pipe.execute(), strict=True):
            if not raw:
                continue  # presence key expired: not live
            h = {key.decode(): value.decode("utf-8", "replace") for key, value in raw.items()}
            records.append(
                ProcessRecord(
                    identity=identity,
                    hostname=h.get("hostname", ""),
                    pid=_number(h.get("pid"), int),
                    tag=h.get("tag", ""),
                    concurrency=_number(h.get("concurrency"), int),
                    busy=_number(h.get("busy"), int),
                    queues=[str(q) for q in _json_field(h.get("queues", "[]"), [])],
                    quiet=h.get("quiet") == "1",
                    started_at=_number(h.get("started_at"), float),
                    last_beat=_number(h.get("beat"), float),
                    rss_kb=_number(h.get("rss_kb"), int),
                    fetch=h.get("fetch", ""),
                    recovery=_json_field(h.get("recovery", "{}"), {}),
                )
            )
        return records

    @property
    def size(self) -> int:
        return len(self.all())

    @staticmethod
    def signal(identity: str, what: str) -> None:
        """Sends "quiet" or "stop" to a process; it acts at its next beat."""
        if what not in ("quiet", "stop"):
            raise ValueError(f"unknown signal {what!r}: use 'quiet' or 'stop'")
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.rpush(k.signals(identity), what)
        pipe.expire(k.signals(identity), 3600)
        pipe.execute()

    @staticmethod
    def last_recovery() -> dict[str, Any]:
        raw = get_redis().get(get_keys().recovery_report)
        return (_loads(raw) or {}) if raw else {}


@dataclass
class RunningJob:
    """A job running now, as its process's last beat summarised it (the
    ``N:workers`` record: a bounded summary, not the payload)."""

    identity: str
    jid: str
    queue: str
    run_at: float
    name: str = ""
    #: The arguments on one line, cut at ``payload.ARGS_PREVIEW_CHARS``.
    args_preview: str = ""
    thread: int | None = None
    retry_count: int | None = None
    #: Why its payload cannot be read ("" when it can).
    unreadable: str = ""
    _payload: Payload | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, identity: str, jid: str, record: bytes) -> RunningJob:
        info = _loads(record)
        if info is None:
            return cls(identity, jid, "", 0.0, unreadable="its record in Redis is unreadable")
        retry_count = info.get("retry_count")
        common: dict[str, Any] = {
            "identity": identity,
            "jid": jid,
            "queue": str(info.get("queue") or ""),
            "run_at": _number(info.get("run_at"), float),
            "thread": info["thread"] if type(info.get("thread")) is int else None,
        }
        if "payload" in info:
            # The shape written before summaries, by a process not yet
            # upgraded: the whole payload.
            payload = _loads(str(info["payload"])) or {}
            retry_count = payload.get("retry_count")
            return cls(
                **common,
                name=str(payload.get("job") or ""),
                args_preview=args_preview(_list(payload.get("args")), _dict(payload.get("kwargs"))),
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


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Workers:
    """Jobs running now, as last reported by each live process's heartbeat."""

    def __iter__(self) -> Iterator[RunningJob]:
        yield from self.all()

    def all(self) -> list[RunningJob]:
        client, k = get_redis(), get_keys()
        identities = sorted(m.decode() for m in client.smembers(k.processes))
        pipe = client.pipeline(transaction=False)
        for identity in identities:
            pipe.hgetall(k.workers(identity))
        jobs = []
        for identity, entries in zip(identities, pipe.execute(), strict=True):
            for jid, record in (entries or {}).items():
                jobs.append(RunningJob.of(identity, jid.decode("utf-8", "replace"), record))
        return sorted(jobs, key=lambda j: j.run_at)

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
        self.key = get_keys().inprogress(identity)

    def __repr__(self) -> str:
        return f"<InProgress {self.identity}>"

    @property
    def size(self) -> int:
        return int(get_redis().llen(self.key))

    def __iter__(self) -> Iterator[JobRecord]:
        for raw in get_redis().lrange(self.key, 0, -1):
            yield JobRecord(raw, source=self.key, kind="inprogress")

    def find(self, jid: str) -> JobRecord | None:
        """The job with this jid, or None (finished, or never here)."""
        for raw in get_redis().lrange(self.key, 0, -1):
            # Most entries are settled from the bytes: a large payload is
            # parsed only when it is likely the one.
            if _field_text(raw, "jid") not in (None, jid):
                continue
            record = JobRecord(raw, source=self.key, kind="inprogress")
            if record.jid == jid:
                return record
        return None


class Stats:
    """Totals (flushed by each process's heartbeat: truthful to one beat)."""

    def __init__(self) -> None:
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.get(k.stat_processed)
        pipe.get(k.stat_failed)
        pipe.zcard(k.schedule)
        pipe.zcard(k.retry)
        pipe.zcard(k.dead)
        pipe.llen(k.unsettled)
        pipe.smembers(k.queues)
        processed, failed, scheduled, retry, dead, unsettled, queues = pipe.execute()
        self.processed = int(processed or 0)
        self.failed = int(failed or 0)
        self.scheduled_size = int(scheduled)
        self.retry_size = int(retry)
        self.dead_size = int(dead)
        self.unsettled_size = int(unsettled)
        names = sorted(q.decode() for q in queues)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(k.queue(name))
        self.queue_sizes = dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
        self.enqueued = sum(self.queue_sizes.values())

    @staticmethod
    def history(days: int = 30, *, today: dt.date | None = None) -> list[tuple[dt.date, int, int]]:
        """(day, processed, failed) for the last ``days`` days, oldest first (UTC)."""
        client, k = get_redis(), get_keys()
        today = today or dt.datetime.now(dt.UTC).date()
        dates = [today - dt.timedelta(days=i) for i in range(days - 1, -1, -1)]
        pipe = client.pipeline(transaction=False)
        for day in dates:
            pipe.get(k.stat_processed_on(day.isoformat()))
            pipe.get(k.stat_failed_on(day.isoformat()))
        values = pipe.execute()
        return [(day, int(values[2 * i] or 0), int(values[2 * i + 1] or 0)) for i, day in enumerate(dates)]


# -- periodic entries ----------------------------------------------------------------


@dataclass
class PeriodicEntry:
    pjid: str
    job: str
    cron: str
    tz: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    until_executed: bool
    next_run: dt.datetime
    last_run: dt.datetime | None  # last enqueued by any process
    running: bool  # the running lock is held: a run is queued or running

    @property
    def name(self) -> str:
        return self.job


class PeriodicEntries:
    """The periodic entries this process knows (``COGWORKER["PERIODIC"]`` and
    ``@periodic``), with when each runs next, when it was last enqueued and
    whether an ``until_executed`` run holds its running lock."""

    def __iter__(self) -> Iterator[PeriodicEntry]:
        yield from self.all()

    def __len__(self) -> int:
        return len(self.all())

    @property
    def size(self) -> int:
        return len(self.all())

    def all(self) -> list[PeriodicEntry]:
        from django_cogworker import periodic

        entries = periodic.entries()
        if not entries:
            return []
        client, k = get_redis(), get_keys()
        pipe = client.pipeline(transaction=False)
        pipe.hmget(k.periodic_last, [e.pjid for e in entries])
        for entry in entries:
            pipe.exists(k.periodic_running(entry.pjid))
        last, *running = pipe.execute()
        now = time.time()
        records = []
        for entry, last_at, held in zip(entries, last, running, strict=True):
            last_run = None if last_at is None else dt.datetime.fromtimestamp(float(last_at), tz=dt.UTC)
            records.append(
                PeriodicEntry(
                    pjid=entry.pjid,
                    job=entry.job,
                    cron=entry.cron,
                    tz=entry.tz,
                    queue=periodic.entry_queue(entry),
                    args=list(entry.args),
                    kwargs=dict(entry.kwargs),
                    until_executed=entry.until_executed,
                    next_run=dt.datetime.fromtimestamp(entry.schedule.next_run(now), tz=dt.UTC),
                    last_run=last_run,
                    running=bool(held),
                )
            )
        return records

    def find(self, pjid: str) -> PeriodicEntry | None:
        return next((e for e in self.all() if e.pjid == pjid), None)
