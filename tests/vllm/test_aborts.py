"""Every early end of a request reaches vLLM: checked from vLLM's side.

Each test starts an answer that would run for thousands of tokens (seconds on this model),
ends it early in one way, and then reads the engine process's metrics until vLLM is idle
again: vLLM's own scheduler figures (``vllm:num_requests_running`` and ``..._waiting`` at
0, ``vllm:kv_cache_usage_perc`` at 0), and then asserts, on deltas over the test:

- the SDK received exactly one abort, for a request it knew, and the request ended as
  aborted (or orphaned, for a frontend that died), not finished;
- vLLM never finished it (``vllm:request_success_total{finished_reason="length"}`` did not
  move) and generated fewer tokens than it was asked for.
"""

from __future__ import annotations

import json
import signal

import pytest
import trio
import trio_websocket

from tests.helpers.http import raw_request, read_until
from tests.helpers.processes import Proc
from tests.helpers.vllm import (
    LONG,
    MAX_TOKENS,
    client,
    frontend_on,
    reached_vllm,
    running_in_vllm,
    settled,
)
from tests.helpers.vllm_session import Vllm
from tests.helpers.waiting import HANG_GUARD

pytestmark = pytest.mark.integration


def assert_ended_early(before: dict[str, float], after: dict[str, float], how: str) -> None:
    def delta(name: str) -> float:
        return after[name] - before[name]

    ends = {k: delta(f"trioserve_engine_{k}_total") for k in ("finished", "aborted", "orphaned")}
    seen = {k: delta(f"trioserve_engine_{k}_total") for k in ("aborts_received", "unknown_aborts")}
    assert delta("trioserve_engine_submitted_total") == 1
    assert ends == {"finished": 0, "aborted": 0, "orphaned": 0, how: 1}, (ends, seen)
    assert delta("trioserve_engine_finished_total") == 0
    if how == "aborted":
        assert delta("trioserve_engine_aborts_received_total") == 1  # exactly one abort
        assert delta("trioserve_engine_unknown_aborts_total") == 0
    assert delta('vllm:request_success_total{finished_reason="length"}') == 0
    assert delta("vllm:generation_tokens_total") < MAX_TOKENS


async def test_disconnect_while_streaming_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    before = await settled(vllm)
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    await stream.aclose()
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_disconnect_while_waiting_for_json_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    before = await settled(vllm)
    stream = await raw_request(frontend, "POST", "/v1/completions", json.dumps(LONG).encode())
    await running_in_vllm(vllm)
    await stream.aclose()
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_deadline_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    before = await settled(vllm)
    async with client(frontend.url) as http:
        answer = await http.post("/v1/completions", json=LONG, headers={"x-request-timeout": "1"})
    assert answer.status_code == 504, answer.text
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_delete_request_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    before = await settled(vllm)
    async with (
        client(frontend.url) as http,
        http.stream(
            "POST", "/v1/completions", json={**LONG, "stream": True}, headers={"x-request-id": "d1"}
        ) as response,
    ):
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith("data: ")
        deleted = await http.delete("/v1/requests/d1")
        assert deleted.status_code in (200, 202, 204), deleted.text
        rest = [line async for line in lines]
    assert not any("[DONE]" in line for line in rest)  # ended with an error, not completed
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_websocket_cancel_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    before = await settled(vllm)
    url = frontend.url.replace("http", "ws") + "/v1/ws"
    with trio.fail_after(HANG_GUARD):
        async with trio_websocket.open_websocket_url(url) as ws:
            request = {"type": "request", "id": "w", "endpoint": "completions", "body": LONG}
            await ws.send_message(json.dumps(request))
            first = json.loads(await ws.get_message())
            assert first["type"] == "chunk", first
            await ws.send_message(json.dumps({"type": "cancel", "id": "w"}))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                pass
            assert message["error"]["code"] == "request_cancelled"
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_drain_deadline_aborts_in_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm, drain_delay=0.0, graceful_timeout=1.0)
    before = await settled(vllm)
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    nursery.start_soon(frontend.drain.drain)
    tail = await read_until(stream, b"server_shutting_down")
    assert b"[DONE]" not in tail
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    assert_ended_early(before, await settled(vllm), "aborted")


async def test_a_client_that_stops_reading_is_ended_and_aborted_in_vllm(vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm, stream_buffer=8)
    before = await settled(vllm)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    stream = trio.SocketStream(sock)
    body = json.dumps({**LONG, "stream": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await stream.send_all(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    # Never read: the frontend ends the request itself (slow_client) and aborts it. (Not
    # settled before the submit has reached the engine: vLLM is idle until it has.)
    await reached_vllm(vllm, before)
    assert_ended_early(before, await settled(vllm), "aborted")
    await stream.aclose()


async def test_a_killed_frontends_requests_are_reclaimed_in_vllm(vllm: Vllm, nursery) -> None:
    """A frontend that dies sends no abort: the engine notices its silence (the session's
    engine runs with --frontend-timeout FRONTEND_TIMEOUT) and aborts its requests itself."""
    before = await settled(vllm)
    frontend = await Proc.start(nursery, "run", "--port", "0", "--engine", vllm.address)
    match = await frontend.wait_for_output(r"Running on (http://127\.0\.0\.1:\d+)")
    await frontend.wait_for_output(r"engine \S+ connected")
    host, port = match[1].decode().removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    body = json.dumps({**LONG, "stream": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await stream.send_all(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    await read_until(stream, b'"text"')
    frontend.signal(signal.SIGKILL)
    await frontend.wait()
    assert_ended_early(before, await settled(vllm), "orphaned")
