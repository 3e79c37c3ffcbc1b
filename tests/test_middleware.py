"""Client and server middleware and error handlers, against a real Redis:
order, changes, refusals, outcomes, isolation, and a real worker."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from django_cogworker import execution, middleware, registry, testing
from django_cogworker.conf import get_config
from django_cogworker.errors import ConfigurationError
from django_cogworker.middleware import ClientMiddleware, Result, ServerMiddleware
from django_cogworker.payload import Payload, encode
from django_cogworker.periodic import PeriodicLockMiddleware
from django_cogworker.unique import UniqueClientMiddleware, UniqueServerMiddleware
from testproject.testapp import async_jobs, jobs
from tests.conftest import wait_for

HERE = "tests.test_middleware"
FAIL = "testproject.testapp.jobs.fail"

calls: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def fresh_calls():
    calls.clear()
    yield
    calls.clear()


class Tagger(ClientMiddleware):
    name = "?"

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        calls.append((f"{self.name}.enqueue", at is not None))
        return {**payload, "order": [*payload.get("order", []), self.name]}

    def cancel(self, payload: Payload) -> None:
        calls.append((f"{self.name}.cancel", payload.get("order")))


class First(Tagger):
    name = "First"


class Second(Tagger):
    name = "Second"


class Refuse(ClientMiddleware):
    """Refuses payloads whose first argument is "refuse"."""

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        calls.append(("Refuse.enqueue",))
        return None if payload["args"][:1] == ["refuse"] else payload

    def cancel(self, payload: Payload) -> None:
        calls.append(("Refuse.cancel",))


class Noter(ServerMiddleware):
    name = "?"

    def before(self, payload: Payload) -> None:
        calls.append((f"{self.name}.before", payload["job"]))

    def after(self, payload: Payload, result: Result) -> None:
        calls.append(
            (
                f"{self.name}.after",
                result.status,
                type(result.exc).__name__ if result.exc else None,
                result.retry_at is not None,
                result.final,
            )
        )


class Outer(Noter):
    name = "Outer"


class Inner(Noter):
    name = "Inner"


class Broken(ServerMiddleware):
    """Raises in ``before`` for a run whose first argument is "break", and
    always in ``after``."""

    def before(self, payload: Payload) -> None:
        calls.append(("Broken.before",))
        if payload["args"][:1] == ["break"]:
            raise RuntimeError("before failed")

    def after(self, payload: Payload, result: Result) -> None:
        calls.append(("Broken.after",))
        raise RuntimeError("after failed")


class Tagged(Noter):
    """Acts only on payloads that carry ``tag_me`` (``acts_on``), in both forms."""

    name = "Tagged"
    acts_on = frozenset({"tag_me"})

    async def abefore(self, payload: Payload) -> None:
        calls.append(("Tagged.abefore", payload["job"]))

    async def aafter(self, payload: Payload, result: Result) -> None:
        calls.append(("Tagged.aafter", result.status))


class TaggedClient(ClientMiddleware):
    """Passes every payload without ``tag_me`` as it is (``acts_on``)."""

    acts_on = frozenset({"tag_me"})

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        calls.append(("TaggedClient.enqueue", payload["args"]))
        return {**payload, "tagged": True}

    def cancel(self, payload: Payload) -> None:
        calls.append(("TaggedClient.cancel", payload["args"]))


class NotAMiddleware:
    pass


def handler(exc: BaseException, context: dict[str, Any]) -> None:
    calls.append(("handler", type(exc).__name__, str(exc), context))


def broken_handler(exc: BaseException, context: dict[str, Any]) -> None:
    raise RuntimeError("the error handler itself failed")


def handler_after(exc: BaseException, context: dict[str, Any]) -> None:
    calls.append(("handler_after", context["jid"]))


def queued(cog: Any, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(r) for r in reversed(cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1))]


def run(job_name: str, *args: Any) -> execution.Outcome:
    made = registry.get(job_name)
    assert made is not None
    return execution.execute(encode(made.payload(list(args), {})), get_config(), close_connections=False)


# -- client side ------------------------------------------------------------------------


def test_client_middleware_runs_in_order_and_may_change_the_payload(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.First", f"{HERE}.Second"], "server": []})
    jid = jobs.record.delay("x")
    jobs.record.delay_in(60, "later")
    (payload,) = queued(cog)
    assert payload["jid"] == jid and payload["order"] == ["First", "Second"]
    (entry,) = cog.redis.zrange(cog.key("schedule"), 0, -1)
    assert json.loads(entry)["order"] == ["First", "Second"]
    assert calls == [
        ("First.enqueue", False),
        ("Second.enqueue", False),
        ("First.enqueue", True),  # told when a scheduled job is due
        ("Second.enqueue", True),
    ]


def test_a_refusal_pushes_nothing_and_cancels_what_went_before_in_reverse(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.First", f"{HERE}.Second", f"{HERE}.Refuse"], "server": []})
    assert jobs.record.delay("refuse") is None
    assert queued(cog) == []
    assert calls == [
        ("First.enqueue", False),
        ("Second.enqueue", False),
        ("Refuse.enqueue",),
        ("Second.cancel", ["First", "Second"]),
        ("First.cancel", ["First", "Second"]),
    ]
    calls.clear()
    assert jobs.record.delay("fine") is not None
    assert [p["args"] for p in queued(cog)] == [["fine"]]
    assert ("First.cancel", ["First", "Second"]) not in calls


def test_a_refusal_after_the_unique_lock_releases_it(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.Refuse"], "server": []})
    unique = jobs.record.set(unique_for=60)
    assert unique.delay("refuse") is None
    assert list(cog.redis.scan_iter(match=cog.key("unique:*"))) == []  # the built-in lock was undone
    assert unique.delay("other") is not None
    assert len(list(cog.redis.scan_iter(match=cog.key("unique:*")))) == 1


def test_a_client_chain_that_acts_on_named_fields_skips_a_payload_with_none_of_them(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.TaggedClient"], "server": []})
    chain = middleware.client_chain()
    assert chain.acts_on == {"tag_me", "unique_for"}  # the unique lock's middleware names its field too
    jid = jobs.record.delay("plain")
    assert calls == []  # neither TaggedClient nor the unique lock's middleware was called
    assert [(p["jid"], p["args"], "tagged" in p) for p in queued(cog)] == [(jid, ["plain"], False)]
    plain = jobs.record.payload(["plain"], {})
    chain.cancel(plain)
    assert calls == []
    tagged = {**jobs.record.payload(["tagged"], {}), "tag_me": 1}
    ran = chain.run(tagged)
    assert ran is not None and ran["tagged"] is True
    chain.cancel(ran)
    assert calls == [("TaggedClient.enqueue", ["tagged"]), ("TaggedClient.cancel", ["tagged"])]
    calls.clear()
    unique = jobs.record.set(unique_for=60)  # the lock's own field: the chain runs, TaggedClient too
    assert unique.delay("once") is not None and unique.delay("once") is None
    assert calls == [("TaggedClient.enqueue", ["once"])]  # the second was refused by the lock first
    assert len(list(cog.redis.scan_iter(match=cog.key("unique:*")))) == 1


def test_a_client_middleware_that_names_no_fields_sees_every_payload_with_the_others(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.TaggedClient", f"{HERE}.First"], "server": []})
    assert middleware.client_chain().acts_on is None
    jobs.record.delay("plain")
    assert calls == [("TaggedClient.enqueue", ["plain"]), ("First.enqueue", False)]
    (payload,) = queued(cog)
    assert payload["tagged"] is True and payload["order"] == ["First"]


def test_delay_many_returns_only_the_jids_pushed(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.Refuse"], "server": []})
    jids = jobs.record.delay_many([(("a",), {}), (("refuse",), {}), (("b",), {})])
    assert len(jids) == 2
    assert [(p["jid"], p["args"]) for p in queued(cog)] == [(jids[0], ["a"]), (jids[1], ["b"])]


def test_delay_many_passes_every_payload_through_the_client_chain(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.First", f"{HERE}.Second"], "server": []})
    jids = jobs.record.delay_many([(("a",), {}), (("b",), {})])
    assert [(p["jid"], p["args"], p["order"]) for p in queued(cog)] == [
        (jids[0], ["a"], ["First", "Second"]),
        (jids[1], ["b"], ["First", "Second"]),
    ]


def test_inline_mode_runs_the_client_chain_too(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.Refuse"], "server": []})
    with testing.inline() as result:
        assert jobs.record.delay("refuse") is None
        assert jobs.record.delay("fine") is not None
    assert [o.kind for o in result.outcomes] == [execution.ACK]
    assert [n["tag"] for n in cog.notes()] == ["fine"]


# -- server side ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_name", "kind", "status", "error", "retry_at"),
    [
        ("testproject.testapp.jobs.record", execution.ACK, "success", None, False),
        ("testproject.testapp.jobs.fail", execution.RETRY, "retry", "ValueError", True),
        ("testproject.testapp.jobs.fail_no_retry", execution.DEAD, "dead", "ValueError", False),
        ("testproject.testapp.jobs.fail_and_drop", execution.ACK, "dropped", "ValueError", False),
    ],
)
def test_server_middleware_wraps_the_run_and_hears_how_it_ended(cog, job_name, kind, status, error, retry_at):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Outer", f"{HERE}.Inner"]})
    outcome = run(job_name, "x")
    assert outcome.kind == kind
    final = status != "retry"
    assert calls == [
        ("Outer.before", job_name),
        ("Inner.before", job_name),
        ("Inner.after", status, error, retry_at, final),  # reverse order
        ("Outer.after", status, error, retry_at, final),
    ]
    assert len(cog.notes()) == 1  # the job ran once, between the two


def test_a_failing_before_fails_the_run_and_only_entered_middleware_hear_after(cog):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Outer", f"{HERE}.Broken", f"{HERE}.Inner"]})
    outcome = run("testproject.testapp.jobs.record", "break")
    assert outcome.kind == execution.RETRY
    assert outcome.payload is not None and outcome.payload["error_message"] == "before failed"
    assert cog.notes() == []  # the job did not run
    assert calls == [
        ("Outer.before", "testproject.testapp.jobs.record"),
        ("Broken.before",),
        ("Outer.after", "retry", "RuntimeError", True, False),
    ]


def test_a_failing_after_is_logged_and_changes_nothing(cog):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Outer", f"{HERE}.Broken"]})
    outcome = run("testproject.testapp.jobs.record", "fine")
    assert outcome.kind == execution.ACK and not outcome.failed
    assert calls[-2:] == [("Broken.after",), ("Outer.after", "success", None, False, True)]


@pytest.mark.parametrize(
    ("job_name", "before", "after"),
    [
        ("testproject.testapp.jobs.record", "Tagged.before", "Tagged.after"),
        (async_jobs.anoop.name, "Tagged.abefore", "Tagged.aafter"),
    ],
)
def test_a_payload_that_no_middleware_of_the_chain_acts_on_skips_it(cog, job_name, before, after):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Tagged"]})
    made = registry.get(job_name)
    assert made is not None
    args = ["x"] if not made.coroutine else []
    outcome = execution.execute(encode(made.payload(args, {})), get_config(), close_connections=False)
    assert outcome.kind == execution.ACK and not outcome.failed
    assert calls == []  # neither Tagged nor the locks' middleware (acts_on too) was called
    tagged = {**made.payload(args, {}), "tag_me": 1}
    outcome = execution.execute(encode(tagged), get_config(), close_connections=False)
    assert outcome.kind == execution.ACK and not outcome.failed
    assert [call[:2] for call in calls] == [(before, job_name), (after, "success")]


def test_a_middleware_that_names_no_fields_sees_every_payload_with_the_others(cog):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Tagged", f"{HERE}.Outer"]})
    assert middleware.server_chain().acts_on is None
    run("testproject.testapp.jobs.record", "x")
    job_name = "testproject.testapp.jobs.record"
    assert calls == [
        ("Tagged.before", job_name),
        ("Outer.before", job_name),
        ("Outer.after", "success", None, False, True),
        ("Tagged.after", "success", None, False, True),
    ]


# -- the chains ---------------------------------------------------------------------------


def test_chains_are_built_once_per_process_with_ours_first(cog):
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.First"], "server": [f"{HERE}.Outer"]})
    client_chain, server_chain = middleware.client_chain(), middleware.server_chain()
    assert middleware.client_chain() is client_chain and middleware.server_chain() is server_chain
    assert [type(m) for m in client_chain.items] == [UniqueClientMiddleware, First]
    assert [type(m) for m in server_chain.items] == [UniqueServerMiddleware, PeriodicLockMiddleware, Outer]
    cog.configure(MIDDLEWARE={"client": [], "server": []})
    assert [type(m) for m in middleware.server_chain().items] == [
        UniqueServerMiddleware,
        PeriodicLockMiddleware,
    ]
    cog.configure(MIDDLEWARE={"client": [f"{HERE}.First"], "server": [f"{HERE}.Outer"]})
    assert middleware.server_chain() is server_chain  # the same instances again


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.no_such_module.Thing", "cannot import 'tests.no_such_module.Thing'"),
        (f"{HERE}.NotAMiddleware", "is not a ClientMiddleware subclass"),
    ],
)
def test_a_bad_middleware_is_a_configuration_error(cog, path, message):
    cog.configure(MIDDLEWARE={"client": [path], "server": []})
    with pytest.raises(ConfigurationError, match=message):
        jobs.record.delay("x")
    assert queued(cog) == []


# -- error handlers ------------------------------------------------------------------------


def test_error_handlers_get_the_exception_and_the_jobs_context_for_every_failure(cog):
    cog.configure(ERROR_HANDLERS=[f"{HERE}.handler", f"{HERE}.broken_handler", f"{HERE}.handler_after"])
    jid = jobs.fail.delay("boom")  # retry=2: three runs, three failures
    testing.drain()

    def dead_yet() -> int:
        testing.drain(include_scheduled=True)
        return int(cog.redis.zcard(cog.key("dead")))

    wait_for(dead_yet, 10, "the retries to run out")
    handled = [c for c in calls if c[0] == "handler"]
    assert [(name, message) for _, name, message, _ in handled] == [("ValueError", "boom")] * 3
    contexts = [c[3] for c in handled]
    assert [c["retry_count"] for c in contexts] == [0, 1, 2]
    for context in contexts:
        assert (context["jid"], context["job"], context["queue"]) == (
            jid,
            "testproject.testapp.jobs.fail",
            "default",
        )
        assert context["payload"]["error_class"] == "ValueError"
    # A failing handler is logged and does not keep the next one from running.
    assert [c for c in calls if c[0] == "handler_after"] == [("handler_after", jid)] * 3


def test_error_handlers_are_not_called_on_success(cog):
    cog.configure(ERROR_HANDLERS=[f"{HERE}.handler"])
    run("testproject.testapp.jobs.record", "fine")
    assert calls == []


# -- a real worker ------------------------------------------------------------------------


def test_a_worker_runs_the_configured_middleware_and_error_handlers(cog):
    cog.configure(
        MIDDLEWARE={
            "client": ["testproject.testapp.middleware.TagPayloads"],
            "server": ["testproject.testapp.middleware.NoteRuns"],
        }
    )
    ok = jobs.record.delay("fine")
    bad = jobs.fail.delay("boom")
    worker = cog.start_worker()
    wait_for(lambda: cog.redis.zcard(cog.key("dead")) == 1 and len(cog.notes("middleware")) == 8, 20, "runs")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0

    notes = cog.notes("middleware")
    assert {n["pid"] for n in notes} == {worker.pid}
    assert all(n["tagged"] == "TagPayloads" for n in notes if n["hook"] == "before")  # the client side ran
    assert [(n["hook"], n.get("status")) for n in notes if n["jid"] == ok] == [
        ("before", None),
        ("after", "success"),
    ]
    assert [(n["hook"], n.get("status"), n.get("error")) for n in notes if n["jid"] == bad] == [
        ("before", None, None),
        ("after", "retry", "ValueError"),
        ("before", None, None),
        ("after", "retry", "ValueError"),
        ("before", None, None),
        ("after", "dead", "ValueError"),
    ]
    errors = cog.notes("errors")  # the ERROR_HANDLERS of the test settings
    assert errors == [{"error": "ValueError", "jid": bad, "job": FAIL}] * 3


class Scribble(ServerMiddleware):
    def before(self, payload: Payload) -> None:
        payload["scribbled"] = True

    def after(self, payload: Payload, result: Result) -> None:
        calls.append(("Scribble.after", payload.get("scribbled")))


def test_what_server_middleware_writes_in_the_payload_stays_with_it(cog):
    cog.configure(MIDDLEWARE={"client": [], "server": [f"{HERE}.Scribble"]})
    outcome = run(FAIL, "x")
    assert calls == [("Scribble.after", True)]  # shared by before() and after()
    assert outcome.payload is not None and "scribbled" not in outcome.payload  # not filed in retry
