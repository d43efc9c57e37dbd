"""The drain sequence, step by step, in-process with short timings.

A "signal" here is a call to ``drain.drain()`` (first) or ``drain.begin()`` (second): the
signal handler does exactly that (``DrainController.run``), and the process-level tests
(``tests/process/test_drain.py``) send real signals.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from tests.helpers.frontends import SERVERS, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve import metrics
from trioserve.ends import EndReason

LONG = {"prompt": "drain", "max_tokens": 100_000}
pytestmark = pytest.mark.parametrize("http_server", SERVERS)


def draining_gauge() -> float:
    return metrics.REGISTRY.get_sample_value("trioserve_draining")


async def test_readiness_fails_at_once_and_new_connections_are_served_during_the_delay(
    nursery, engine, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=HANG_GUARD * 10
    )
    nursery.start_soon(frontend.drain.drain)
    await wait_until(lambda: frontend.app.services.state.draining, "the drain to begin")
    async with frontend.client() as client:  # a new connection, after the signal
        assert (await client.get("/health")).status_code == 503
        assert (await client.get("/live")).status_code == 200
        assert "trioserve_draining 1.0" in (await client.get("/metrics")).text
        response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert response.status_code == 200
        assert "connection" not in response.headers  # still keep-alive during the delay
    # A second signal skips the delay: the listener closes, then the process can stop.
    frontend.drain.begin()
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    with pytest.raises(OSError):
        await trio.open_tcp_stream(frontend.host, frontend.port)
    assert draining_gauge() == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_after_the_delay_the_listener_is_closed_and_in_flight_responses_say_close(
    nursery, engine, stream, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=HANG_GUARD
    )
    # An idle keep-alive connection, and a request that will answer after the listener closed
    # (a stream's response start is built while the engine works: it must be built again).
    idle = await raw_request(frontend, "GET", "/live", b"")
    await read_until(idle, b"alive")
    request = {"prompt": "x", "max_tokens": 2, "mock_ttft_ms": 300, "stream": stream}
    body = json.dumps(request).encode()
    busy = await raw_request(frontend, "POST", "/v1/completions", body, x_request_id="busy")
    await wait_until(
        lambda: frontend.app.services.registry.get("busy"), "the request to be in flight"
    )
    nursery.start_soon(frontend.drain.drain)
    with trio.fail_after(HANG_GUARD):
        await frontend.drain.stop_accepting.wait()
    with pytest.raises(OSError):
        await trio.open_tcp_stream(frontend.host, frontend.port)
    # The idle connection is closed by the server without a request.
    with trio.fail_after(HANG_GUARD):
        assert await idle.receive_some(1024) == b""
    # The in-flight request completes, with Connection: close.
    answer = await read_until(busy, b"}")
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in answer.lower()
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()


async def test_in_flight_streams_run_to_completion_within_the_grace_period(
    nursery, engine, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=HANG_GUARD
    )
    result = {}

    async def stream_it() -> None:
        async with frontend.client() as client:
            result["r"] = await client.post(
                "/v1/completions",
                json={
                    "prompt": "x",
                    "max_tokens": 40,
                    "stream": True,
                    "mock_tokens_per_second": 100,
                },
            )

    async with trio.open_nursery() as requests:
        requests.start_soon(stream_it)
        await wait_until(lambda: len(frontend.app.services.registry) == 1, "the stream to start")
        requests.start_soon(frontend.drain.drain)
        with trio.fail_after(HANG_GUARD):
            await frontend.stopped.wait()
        requests.cancel_scope.cancel()
    assert result["r"].text.endswith("data: [DONE]\n\n")
    assert engine.core.stats.aborts_received == 0


async def test_grace_deadline_ends_what_is_left_with_errors_and_one_abort_each(
    nursery, engine, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=0.5
    )
    before = metrics.REGISTRY.get_sample_value("trioserve_engine_aborts_total", {"reason": "drain"})
    results = {}

    async def call(name: str, body: dict) -> None:
        async with frontend.client() as client:
            results[name] = await client.post(
                "/v1/completions", json=body, headers={"x-request-id": name}
            )

    async with trio.open_nursery() as requests:
        requests.start_soon(call, "sse", {**LONG, "stream": True})
        requests.start_soon(call, "json", {**LONG, "mock_ttft_ms": 600_000})
        await wait_until(lambda: len(frontend.app.services.registry) == 2, "two requests in flight")
        requests.start_soon(frontend.drain.drain)
    events = [e for e in results["sse"].text.split("\n\n") if e]
    assert "data: [DONE]" not in events
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "server_shutting_down"
    assert results["json"].status_code == 503
    assert results["json"].json()["error"]["code"] == "server_shutting_down"
    await wait_until(lambda: frontend.ends("sse") and frontend.ends("json"), "both aborts")
    assert frontend.ends("sse") == frontend.ends("json") == ["aborted"]
    after = metrics.REGISTRY.get_sample_value("trioserve_engine_aborts_total", {"reason": "drain"})
    assert after == before + 2
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()


async def test_second_signal_ends_everything_at_once(nursery, engine, http_server):
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        drain_delay=HANG_GUARD * 10,
        graceful_timeout=HANG_GUARD * 10,
    )
    result = {}

    async def stream_it() -> None:
        async with frontend.client() as client:
            result["r"] = await client.post("/v1/completions", json={**LONG, "stream": True})

    async with trio.open_nursery() as requests:
        requests.start_soon(stream_it)
        await wait_until(lambda: len(frontend.app.services.registry) == 1, "the stream to start")
        requests.start_soon(frontend.drain.drain)
        await wait_until(lambda: frontend.app.services.state.draining, "the drain to begin")
        frontend.drain.begin()  # the second signal
    assert "server_shutting_down" in result["r"].text
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()


async def test_requests_after_the_grace_deadline_on_open_connections_get_503(
    nursery, engine, http_server
):
    frontend = await start_frontend(nursery, engine, server=http_server)
    frontend.app.services.end_all(EndReason.DRAIN)  # as the drain deadline does
    async with httpx.AsyncClient(base_url=frontend.url) as client:
        response = await client.post("/v1/completions", json={"prompt": "x"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "server_shutting_down"
