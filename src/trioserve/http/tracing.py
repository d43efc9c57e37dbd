"""OpenTelemetry traces of generation requests, sent over OTLP/HTTP (protobuf).

Imported only with ``--otlp-traces-endpoint``: without it, nothing of OpenTelemetry is
loaded (it is an optional extra, ``pip install 'trioserve[tracing]'``).

One span per engine request (a client request of ``n`` choices or images has one per
member, siblings), kind SERVER, named after the GenAI semantic conventions
(``chat mock``), continuing the W3C ``traceparent`` the client sent, with:

- attributes: ``gen_ai.operation.name``, ``gen_ai.request.model``,
  ``gen_ai.request.max_tokens``/``temperature``/``top_p`` where given,
  ``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.response.finish_reasons``,
  ``gen_ai.latency.time_to_first_token``/``e2e``/``time_in_queue`` (vLLM's names, so that
  its spans and ours read alike), ``trioserve.end_reason``, ``http.route``,
  ``client.address``, ``trioserve.transport``, ``trioserve.request.id``;
- events at the moments they happened: ``submit``, ``first_output``, ``last_byte`` (a
  completed request), ``abort`` (an early end, with its ``reason``).

The span's context travels to the engine in the submit (``Submit.trace_context``), so an
engine's own spans join the trace. Spans are recorded when the request ends, from the
times its handle kept; a background thread of the SDK batches and exports them.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import attrs
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..ends import Ending, EndReason, Outcome
from ..protocol import Submit
from .lifecycle import RequestHandle

#: Seconds one export may take (the collector's answer), and what flushing the traces
#: left at shutdown may take in all.
EXPORT_TIMEOUT = 5.0
#: Spans waiting for export, at most; past it the SDK drops them (and says so).
MAX_QUEUED_SPANS = 4096

#: ``gen_ai.operation.name`` of each task (the conventions' names where they have one).
OPERATIONS = {"chat": "chat", "completion": "text_completion"}
#: Parameters recorded as ``gen_ai.request.*``.
REQUEST_PARAMS = ("max_tokens", "temperature", "top_p", "seed")
#: Ends that are the client's doing, not a failure of the server's.
CLIENT_ENDS = frozenset({EndReason.DISCONNECT, EndReason.CANCEL})


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: ``endpoint`` as given, or with ``/v1/traces`` added
    when it names no path (as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is read)."""
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class Tracing:
    """A tracer provider of trioserve's own (the process-wide one is left alone) that
    exports to ``endpoint``."""

    def __init__(self, endpoint: str, service_name: str = "trioserve") -> None:
        self.endpoint = traces_url(endpoint)
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=self.endpoint, timeout=EXPORT_TIMEOUT),
                max_queue_size=MAX_QUEUED_SPANS,
                export_timeout_millis=EXPORT_TIMEOUT * 1000,
            )
        )
        self.tracer = self.provider.get_tracer("trioserve")
        self.propagator = TraceContextTextMapPropagator()
        # The handles keep time.perf_counter(); spans take nanoseconds since the epoch.
        self._epoch_offset = time.time_ns() - time.perf_counter_ns()

    def _ns(self, moment: float) -> int:
        return int(moment * 1e9) + self._epoch_offset

    def begin(self, handle: RequestHandle, submit: Submit) -> Submit:
        """Start the request's span (from its arrival) and put its context in the submit."""
        carrier: dict[str, str] = {}
        headers = handle.headers
        if headers:
            for name in ("traceparent", "tracestate"):
                value = headers.get(name.encode())
                if value:
                    carrier[name] = value.decode("latin-1")
        parent = self.propagator.extract(carrier) if carrier else None
        operation = OPERATIONS.get(submit.task, submit.task)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": submit.model,
            "http.route": handle.route,
            "trioserve.transport": handle.transport,
            "trioserve.request.id": handle.id,
        }
        for name in REQUEST_PARAMS:
            value = submit.params.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[f"gen_ai.request.{name}"] = value
        if handle.client:
            attributes["client.address"] = handle.client[0]
        span = self.tracer.start_span(
            f"{operation} {submit.model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=self._ns(handle.arrived),
        )
        handle.trace = (span, time.perf_counter())
        context: dict[str, str] = {}
        self.propagator.inject(context, context=trace.set_span_in_context(span))
        return attrs.evolve(submit, trace_context=context)

    def end(self, handle: RequestHandle, outcome: Ending, now: float) -> None:
        """End the request's span: its figures, and the events at their moments."""
        span, submitted = handle.trace
        span.add_event("submit", timestamp=self._ns(submitted))
        sub = handle.sub
        attributes: dict[str, Any] = {
            "trioserve.end_reason": outcome,
            "gen_ai.latency.e2e": now - handle.arrived,
        }
        if sub is not None and sub.outputs:
            span.add_event("first_output", timestamp=self._ns(sub.first_output_at))
            attributes["gen_ai.latency.time_to_first_token"] = sub.first_output_at - handle.arrived
        final = sub.final if sub is not None else None
        if final is not None:
            if final.usage is not None:
                attributes["gen_ai.usage.input_tokens"] = final.usage.prompt_tokens
                attributes["gen_ai.usage.output_tokens"] = final.usage.completion_tokens
            if final.finish_reason is not None:
                attributes["gen_ai.response.finish_reasons"] = [final.finish_reason]
            if final.queue_time is not None:
                attributes["gen_ai.latency.time_in_queue"] = final.queue_time
            if final.error is not None:
                attributes["error.type"] = final.error.type
        if handle.submit is not None:
            attributes["gen_ai.response.model"] = handle.submit.model
        if outcome is Outcome.COMPLETED:
            span.add_event("last_byte", timestamp=self._ns(now))
            span.set_status(Status(StatusCode.OK))
        else:
            if handle.ended_at:
                span.add_event(
                    "abort", {"reason": handle.end_reason or outcome}, self._ns(handle.ended_at)
                )
            if outcome not in CLIENT_ENDS:
                span.set_status(Status(StatusCode.ERROR, outcome))
        span.set_attributes(attributes)
        span.end(end_time=self._ns(now))

    def shutdown(self) -> None:
        """Export what is queued (within :data:`EXPORT_TIMEOUT`) and stop. Blocking: run
        it in a thread."""
        self.provider.force_flush(timeout_millis=int(EXPORT_TIMEOUT * 1000))
        self.provider.shutdown()
