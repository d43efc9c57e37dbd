"""Every early end of a request cancels its nursery and sends exactly one abort.

Each test checks the engine side (how the engine saw the request end), the frontend's
in-flight count, and that the next request is still served.
"""

from __future__ import annotations

import json

import trio

from tests.helpers.frontends import LONG, running, start_engine, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.waiting import wait_until
from trioserve import metrics


def aborts(reason: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value("trioserve_engine_aborts_total", {"reason": reason})
        or 0.0
    )


async def assert_ended_once_and_still_serving(frontend, request_id: str, how: str) -> None:
    await wait_until(lambda: frontend.ends(request_id), f"the engine to see {request_id} end")
    assert frontend.ends(request_id) == [how]
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")
    assert frontend.engine.core.stats.unknown_aborts == 0  # never a second abort
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions", json={**LONG, "max_tokens": 2, "stream": True}
        )
        assert response.text.endswith("data: [DONE]\n\n")


async def test_disconnect_mid_stream_aborts_engine_request(frontend):
    before = aborts("disconnect")
    body = json.dumps({**LONG, "stream": True}).encode()
    stream = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="d1")
    await read_until(stream, b"data: ")
    await stream.aclose()
    await assert_ended_once_and_still_serving(frontend, "d1", "aborted")
    assert aborts("disconnect") == before + 1


async def test_disconnect_while_waiting_for_json_aborts_engine_request(frontend):
    body = json.dumps(LONG).encode()
    stream = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="d2")
    await running(frontend, "d2")
    await stream.aclose()
    await assert_ended_once_and_still_serving(frontend, "d2", "aborted")


async def test_disconnect_before_first_byte_aborts_engine_request(frontend):
    body = json.dumps({**LONG, "stream": True, "mock_ttft_ms": 600_000}).encode()
    stream = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="d3")
    await running(frontend, "d3")
    await stream.aclose()
    await assert_ended_once_and_still_serving(frontend, "d3", "aborted")


async def test_deadline_before_first_byte_is_504_and_aborts(frontend):
    before = aborts("deadline")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={**LONG, "mock_ttft_ms": 600_000},
            headers={"x-request-timeout": "0.2", "x-request-id": "t1"},
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    await assert_ended_once_and_still_serving(frontend, "t1", "aborted")
    assert aborts("deadline") == before + 1


async def test_deadline_mid_stream_ends_with_error_event_and_no_done(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={**LONG, "stream": True},
            headers={"x-request-timeout": "0.3", "x-request-id": "t2"},
        )
    assert response.status_code == 200
    events = [e for e in response.text.split("\n\n") if e]
    assert "data: [DONE]" not in events
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "deadline_exceeded"
    assert len(events) > 1
    await assert_ended_once_and_still_serving(frontend, "t2", "aborted")


async def test_server_wide_deadline_applies_and_header_is_capped(nursery, engine, http_server):
    frontend = await start_frontend(
        nursery, engine, server=http_server, request_timeout=0.2, max_request_timeout=0.3
    )
    async with frontend.client() as client:
        default = await client.post("/v1/chat/completions", json={**LONG, "mock_ttft_ms": 60_000})
        capped = await client.post(
            "/v1/chat/completions",
            json={**LONG, "mock_ttft_ms": 60_000},
            headers={"x-request-timeout": "500"},
        )
        bad = await client.post(
            "/v1/chat/completions", json=LONG, headers={"x-request-timeout": "soon"}
        )
    assert default.status_code == 504 and "0.2 s" in default.json()["error"]["message"]
    assert capped.status_code == 504 and "0.3 s" in capped.json()["error"]["message"]
    assert bad.status_code == 400


async def test_explicit_cancel_by_request_id(frontend):
    before = aborts("cancel")
    results = {}

    async def stream_it() -> None:
        async with frontend.client() as client:
            results["r"] = await client.post(
                "/v1/chat/completions",
                json={**LONG, "stream": True},
                headers={"x-request-id": "c1"},
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream_it)
        await running(frontend, "c1")
        async with frontend.client() as client:
            cancelled = await client.delete("/v1/requests/c1")
            missing = await client.delete("/v1/requests/nope")
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True
    assert missing.status_code == 404
    events = [e for e in results["r"].text.split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "request_cancelled"
    await assert_ended_once_and_still_serving(frontend, "c1", "aborted")
    assert aborts("cancel") == before + 1


async def test_cancel_before_first_byte_answers_499(frontend):
    results = {}

    async def wait_it() -> None:
        async with frontend.client() as client:
            results["r"] = await client.post(
                "/v1/chat/completions",
                json={**LONG, "mock_ttft_ms": 600_000},
                headers={"x-request-id": "c2"},
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_it)
        await running(frontend, "c2")
        async with frontend.client() as client:
            await client.delete("/v1/requests/c2")
    assert results["r"].status_code == 499
    await assert_ended_once_and_still_serving(frontend, "c2", "aborted")


async def test_duplicate_in_flight_request_id_is_409(frontend):
    body = json.dumps({**LONG, "stream": True}).encode()
    stream = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="dup")
    await running(frontend, "dup")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=LONG, headers={"x-request-id": "dup"}
        )
    assert response.status_code == 409
    await stream.aclose()
    await assert_ended_once_and_still_serving(frontend, "dup", "aborted")


async def test_slow_client_is_ended_and_aborted_without_holding_up_others(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, stream_buffer=8)
    before = aborts("slow_client")
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    stream = trio.SocketStream(sock)
    body = json.dumps(
        {**LONG, "max_tokens": 10_000_000, "stream": True, "mock_tokens_per_second": 1e6}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: slow\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    # Never read: the frontend must end the request on its own, and others keep flowing.
    async with frontend.client() as client:
        ok = await client.post("/v1/chat/completions", json={**LONG, "max_tokens": 3})
        assert ok.status_code == 200
    await wait_until(lambda: frontend.ends("slow"), "the slow client's request to end")
    assert frontend.ends("slow") == ["aborted"]
    assert aborts("slow_client") == before + 1
    await stream.aclose()
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")


async def test_in_flight_gauge_returns_to_zero(frontend):
    body = json.dumps({**LONG, "stream": True}).encode()
    streams = []
    for i in range(5):
        stream = await raw_request(
            frontend, "POST", "/v1/chat/completions", body, x_request_id=f"g{i}"
        )
        streams.append(stream)
    for i in range(5):
        await running(frontend, f"g{i}")
    assert metrics.REGISTRY.get_sample_value("trioserve_requests_in_flight") == 5
    for stream in streams:
        await stream.aclose()
    await wait_until(
        lambda: metrics.REGISTRY.get_sample_value("trioserve_requests_in_flight") == 0,
        "the in-flight gauge to read zero",
    )
    await wait_until(lambda: all(frontend.ends(f"g{i}") for i in range(5)), "five aborts")
    assert [frontend.ends(f"g{i}") for i in range(5)] == [["aborted"]] * 5
