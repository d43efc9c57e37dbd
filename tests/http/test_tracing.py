"""Traces (http/tracing.py, ``--otlp-traces-endpoint``), received by a real OTLP/HTTP
endpoint in the test (127.0.0.1) that decodes the protobuf export: one span per request,
continuing the client's ``traceparent``, its context passed on to the engine."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.helpers.frontends import LONG, capture_submits, running, start_frontend
from tests.helpers.step_engine import start_step_engine
from tests.helpers.waiting import wait_until
from trioserve.http.tracing import traces_url
from trioserve.protocol import Usage
from trioserve.sdk import Output

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint: decodes each export, keeps its spans and their
    resources' attributes."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.resources: list[dict] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                export = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.paths.append(self.path)
                    for resource_spans in export.resource_spans:
                        receiver.resources.append(attributes(resource_spans.resource.attributes))
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend(scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [span for span in self.spans if span.name == name]


def attributes(values) -> dict:
    out = {}
    for kv in values:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        receiver.thread.join(timeout=5)


async def flush(frontend) -> None:
    tracing = frontend.app.services.observer.tracing
    await trio.to_thread.run_sync(tracing.provider.force_flush)


def test_an_endpoint_without_a_path_gets_the_traces_path():
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/custom/path") == "http://c:4318/custom/path"


async def test_a_request_s_span_continues_the_client_s_trace_and_reaches_the_engine(
    nursery, engine, http_server, otlp
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, otlp_traces_endpoint=otlp.url
    )
    submits = capture_submits(frontend)
    headers = {"traceparent": TRACEPARENT, "x-request-id": "traced-1"}
    body = {"messages": [{"role": "user", "content": "one two"}], "max_tokens": 3}
    async with frontend.client() as client:
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 200
    await wait_until(lambda: frontend.app.services.registry.get("traced-1") is None)
    await flush(frontend)
    await wait_until(lambda: otlp.named("chat mock"), "the span to arrive")

    (span,) = otlp.named("chat mock")
    assert otlp.paths == ["/v1/traces"]
    assert otlp.resources[0]["service.name"] == "trioserve"
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert span.status.code == span.status.STATUS_CODE_OK
    figures = attributes(span.attributes)
    assert figures == {
        **figures,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "mock",
        "gen_ai.request.max_tokens": 3,
        "gen_ai.response.model": "mock",
        "gen_ai.usage.input_tokens": 2,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ["length"],
        "trioserve.end_reason": "completed",
        "trioserve.transport": "json",
        "trioserve.request.id": "traced-1",
        "http.route": "/v1/chat/completions",
        "client.address": "127.0.0.1",
    }
    assert 0 < figures["gen_ai.latency.time_to_first_token"] <= figures["gen_ai.latency.e2e"]
    assert figures["gen_ai.latency.time_in_queue"] >= 0  # the mock's report: it queues nothing
    events = [event.name for event in span.events]
    assert events == ["submit", "first_output", "last_byte"]
    times = [event.time_unix_nano for event in span.events]
    assert span.start_time_unix_nano <= times[0] <= times[1] <= times[2] <= span.end_time_unix_nano
    # The engine was given the span's context: its spans would be this span's children.
    (submit,) = [s for s in submits if s.request_id == "traced-1"]
    assert submit.trace_context == {"traceparent": f"00-{TRACE_ID}-{span.span_id.hex()}-01"}


async def test_an_ended_request_s_span_says_why_with_an_abort_event(
    nursery, engine, http_server, otlp
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, otlp_traces_endpoint=otlp.url
    )
    async with frontend.client() as client, trio.open_nursery() as requests:
        requests.start_soon(
            lambda: client.post(
                "/v1/chat/completions", json=LONG, headers={"x-request-id": "traced-2"}
            )
        )
        await running(frontend, "traced-2")
        assert (await client.delete("/v1/requests/traced-2")).status_code == 200
    await flush(frontend)
    await wait_until(lambda: otlp.named("chat mock"), "the span to arrive")
    (span,) = otlp.named("chat mock")
    assert len(span.parent_span_id) == 0  # no traceparent came: a trace of its own
    assert attributes(span.attributes)["trioserve.end_reason"] == "cancel"
    assert span.status.code == span.status.STATUS_CODE_UNSET  # the client's doing
    abort = [event for event in span.events if event.name == "abort"]
    assert [attributes(event.attributes) for event in abort] == [{"reason": "cancel"}]
    assert "last_byte" not in [event.name for event in span.events]


async def test_an_engine_error_marks_the_span_failed(nursery, engine, http_server, otlp):
    frontend = await start_frontend(
        nursery, engine, server=http_server, otlp_traces_endpoint=otlp.url
    )
    body = {"prompt": "x", "max_tokens": 3, "mock_error_after": 1, "mock_error_status": 503}
    async with frontend.client() as client:
        assert (await client.post("/v1/completions", json=body)).status_code == 503
    await flush(frontend)
    await wait_until(lambda: otlp.named("text_completion mock"), "the span to arrive")
    (span,) = otlp.named("text_completion mock")
    assert span.status.code == span.status.STATUS_CODE_ERROR
    figures = attributes(span.attributes)
    assert figures["trioserve.end_reason"] == "engine_error"
    assert figures["error.type"] == "engine_error"


async def test_a_backend_sees_the_trace_context_on_its_request(nursery, http_server, otlp):
    engine, backend = await start_step_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, otlp_traces_endpoint=otlp.url
    )
    body = {"model": "steps", "prompt": "hi"}
    async with frontend.client() as client, trio.open_nursery() as requests:
        requests.start_soon(
            lambda: client.post("/v1/completions", json=body, headers={"traceparent": TRACEPARENT})
        )
        await wait_until(lambda: backend.requests, "the backend to get the request")
        await backend.step(Output("done", usage=Usage(1, 1), finish_reason="stop"))
    (request,) = backend.requests
    assert request.trace_context["traceparent"].startswith(f"00-{TRACE_ID}-")
