"""django_cogworker.contrib.otel, against a real Redis: the trace context
travels in the payload from ``.delay()`` to the worker, which runs the job
in a CONSUMER span child of the enqueuing span.

Spans are made with a TracerProvider of each test's own (named on the
server middleware's ``tracer_provider``), exported to memory: OpenTelemetry's
global provider can be set once per process, and is never set here."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_cogworker import execution, job, registry, testing
from django_cogworker.conf import get_config
from django_cogworker.contrib.otel import TracingServerMiddleware
from django_cogworker.payload import encode
from testproject.testapp import jobs
from tests.conftest import wait_for

CLIENT = "django_cogworker.contrib.otel.TraceContextClientMiddleware"
SERVER = "django_cogworker.contrib.otel.TracingServerMiddleware"
RECORD = "testproject.testapp.jobs.record"
FAIL = "testproject.testapp.jobs.fail"
PACKAGE = Path(__file__).resolve().parent.parent / "django_cogworker"

seen_in_job: list[trace.SpanContext] = []


@job
def remember_current_span() -> None:
    seen_in_job.append(trace.get_current_span().get_span_context())


@pytest.fixture
def exporter(cog: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(TracingServerMiddleware, "tracer_provider", provider)
    cog.configure(MIDDLEWARE={"client": [CLIENT], "server": [SERVER]})
    seen_in_job.clear()
    yield memory
    provider.shutdown()


def tracer() -> trace.Tracer:
    provider = TracingServerMiddleware.tracer_provider
    assert provider is not None
    return provider.get_tracer("tests")


def job_spans(memory: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in memory.get_finished_spans() if span.kind == SpanKind.CONSUMER]


def queued(cog: Any) -> list[dict[str, Any]]:
    return [json.loads(r) for r in reversed(cog.redis.lrange(cog.key("queue:default"), 0, -1))]


def test_the_job_runs_in_a_consumer_span_child_of_the_enqueuing_span(cog, exporter):
    with tracer().start_as_current_span("request") as parent:
        jid = jobs.record.delay("x")
    enqueued = parent.get_span_context()
    (payload,) = queued(cog)
    assert set(payload["trace"]) == {"traceparent"}
    assert f"{enqueued.trace_id:032x}-{enqueued.span_id:016x}" in payload["trace"]["traceparent"]

    assert testing.drain() == 1
    (span,) = job_spans(exporter)
    assert span.name == f"cogworker run {RECORD}"
    assert span.context.trace_id == enqueued.trace_id
    assert span.parent is not None and span.parent.span_id == enqueued.span_id
    assert dict(span.attributes or {}) == {
        "messaging.system": "cogworker",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": jid,
        "cogworker.job": RECORD,
        "cogworker.retry_count": 0,
        "cogworker.outcome": "success",
    }
    assert span.status.status_code == StatusCode.UNSET
    assert span.events == ()


def test_a_failed_run_records_the_exception_and_status_error_and_its_retry_keeps_the_parent(cog, exporter):
    with tracer().start_as_current_span("request") as parent:
        jobs.fail.delay("boom")
    assert testing.drain() == 1
    (first,) = job_spans(exporter)
    assert first.status.status_code == StatusCode.ERROR
    assert first.status.description == "ValueError: boom"
    (event,) = first.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert (event.attributes or {})["exception.message"] == "boom"
    assert (first.attributes or {})["cogworker.outcome"] == "retry"

    # The retry is due in 0.1 s: the payload filed in retry kept its trace field.
    wait_for(lambda: testing.drain(include_scheduled=True), what="the retry to run")
    first_again, second = sorted(job_spans(exporter), key=lambda s: s.start_time or 0)
    assert first_again.context.span_id == first.context.span_id
    assert (second.attributes or {})["cogworker.retry_count"] == 1
    assert second.parent is not None
    assert second.parent.span_id == parent.get_span_context().span_id


def test_without_an_active_span_nothing_is_added_and_the_job_span_is_a_root(cog, exporter):
    jobs.record.delay("x")
    (payload,) = queued(cog)
    assert "trace" not in payload
    assert testing.drain() == 1
    (span,) = job_spans(exporter)
    assert span.parent is None
    assert span.name == f"cogworker run {RECORD}"


def test_the_job_span_is_current_while_the_job_runs_and_only_then(cog, exporter):
    with tracer().start_as_current_span("request"):
        remember_current_span.delay()
    assert testing.drain() == 1
    (span,) = job_spans(exporter)
    assert seen_in_job == [span.context]  # a span the job makes is its child
    assert not trace.get_current_span().get_span_context().is_valid  # detached after the run


@pytest.mark.parametrize(
    "field",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ["traceparent"],
        {"traceparent": 5},
        {"traceparent": "00-not-a-trace-01"},
        {},
    ],
    ids=["text", "list", "not-text", "malformed", "empty"],
)
def test_a_trace_field_that_is_not_a_trace_context_gives_a_root_span(cog, exporter, field):
    made = registry.get(RECORD)
    assert made is not None
    payload = {**made.payload(["x"], {}), "trace": field}
    outcome = execution.execute(encode(payload), get_config(), close_connections=False)
    assert outcome.kind == execution.ACK
    (span,) = job_spans(exporter)
    assert span.parent is None


def test_an_in_process_worker_traces_the_job_in_its_processor_thread(cog, exporter, in_process):
    in_process(concurrency=1)
    with tracer().start_as_current_span("request") as parent:
        jobs.record.delay("x")
    (span,) = wait_for(lambda: job_spans(exporter), what="the job's span")
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert [n["tag"] for n in cog.notes()] == ["x"]


def test_without_opentelemetry_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "django_cogworker.contrib.otel")
    with pytest.raises(ImportError, match=re.escape('pip install "django-cogworker[otel]"')):
        importlib.import_module("django_cogworker.contrib.otel")


def test_nothing_outside_contrib_imports_contrib():
    pattern = re.compile(
        r"django_cogworker\.contrib|from django_cogworker import contrib|from \.+ import contrib"
    )
    importers = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "contrib" not in path.relative_to(PACKAGE).parts and pattern.search(path.read_text())
    ]
    assert importers == []
