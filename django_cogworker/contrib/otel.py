"""OpenTelemetry tracing of jobs, from the ``.delay()`` that enqueued them.

Duties:
- client side (:class:`TraceContextClientMiddleware`): at ``.delay()``,
  write the caller's trace context (W3C ``traceparent``/``tracestate``,
  and ``baggage``, through the configured propagator) into the payload's
  ``trace`` field, so that it travels through Redis with the job and its
  retries. Nothing is added when no span is active;
- server side (:class:`TracingServerMiddleware`): run each job inside a
  CONSUMER span ``cogworker run <job>``, child of the enqueuing span when
  the payload carries one, a root span otherwise; the span is the current
  one while the job runs, so spans the job makes are its children; a
  failed run records the exception and sets the status to ERROR.

Not done: a PRODUCER span around the push. The client middleware sees a
payload before it is pushed and is not told when the push is done, so such
a span would time nothing; the consumer span is a child of the span that
called ``.delay()`` instead.

A ``trace`` field read from Redis is untrusted text: anything that is not
an object of strings is ignored, and the job gets a root span.

Install with ``pip install "django-cogworker[otel]"`` (the OpenTelemetry
API only; exporting spans needs an SDK set up by the project).
"""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:
    raise ImportError(
        "django_cogworker.contrib.otel needs the OpenTelemetry API, which is not installed: "
        'pip install "django-cogworker[otel]"',
        name=exc.name,
    ) from exc

import django_cogworker
from django_cogworker.context import current_job
from django_cogworker.middleware import ClientMiddleware, Result, ServerMiddleware
from django_cogworker.payload import Payload

#: The payload field that carries the enqueuing trace context.
TRACE_FIELD = "trace"

#: The instrumentation scope of the spans made here.
TRACER_NAME = "django_cogworker"

# Where before() leaves the span and the context token for after(): the
# run's own copy of the payload, which is never pushed back to Redis.
_STATE = "_cogworker_otel"


class TraceContextClientMiddleware(ClientMiddleware):
    """Writes the current trace context into the payload's ``trace`` field."""

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        if not trace.get_current_span().get_span_context().is_valid:
            return payload
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if not carrier:  # a propagator configured to write nothing
            return payload
        return {**payload, TRACE_FIELD: carrier}


class TracingServerMiddleware(ServerMiddleware):
    """Runs every job inside a CONSUMER span ``cogworker run <job>``.

    ``tracer_provider`` is the provider the spans are made with; None (the
    default) is OpenTelemetry's global one. A subclass may name its own.
    List this middleware first in ``COGWORKER["MIDDLEWARE"]["server"]`` so
    that the other middleware run inside the span too."""

    tracer_provider: trace.TracerProvider | None = None

    def __init__(self) -> None:
        # (provider, tracer): replaced whole, so threads read a matching pair.
        self._tracer: tuple[trace.TracerProvider | None, trace.Tracer] | None = None

    def tracer(self) -> trace.Tracer:
        provider = self.tracer_provider
        cached = self._tracer
        if cached is None or cached[0] is not provider:
            made = trace.get_tracer(TRACER_NAME, django_cogworker.__version__, tracer_provider=provider)
            cached = self._tracer = (provider, made)
        return cached[1]

    def before(self, payload: Payload) -> None:
        ctx = current_job()
        name = ctx.name if ctx is not None else str(payload.get("job"))
        queue = ctx.queue if ctx is not None else str(payload.get("queue"))
        parent = propagate.extract(_carrier(payload.get(TRACE_FIELD)))
        span = self.tracer().start_span(
            f"cogworker run {name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "cogworker",
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": str(payload.get("jid") or ""),
                "cogworker.job": name,
                "cogworker.retry_count": ctx.retry_count if ctx is not None else 0,
            },
        )
        # The extracted context, not the current one, as the base: it holds
        # the enqueuer's baggage, and nothing of an earlier job leaks in.
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        payload[_STATE] = (span, token)

    def after(self, payload: Payload, result: Result) -> None:
        state = payload.pop(_STATE, None)
        if state is None:
            return
        span, token = state
        try:
            span.set_attribute("cogworker.outcome", result.status)
            if result.failed and result.exc is not None:
                span.record_exception(result.exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(result.exc).__name__}: {result.exc}"))
        finally:
            otel_context.detach(token)
            span.end()


def _carrier(field: Any) -> dict[str, str]:
    """The text fields of a payload's ``trace`` object; {} for anything else."""
    if not isinstance(field, dict):
        return {}
    return {k: v for k, v in field.items() if isinstance(k, str) and isinstance(v, str)}
