"""Every early end of a request on the direct path reaches vLLM's EngineCore as one ABORT,
seen in vLLM's own scheduler figures; and the WebSocket over the direct path.

The cases of tests/vllm/test_aborts.py (there on the shared path, through ``trioserve
engine vllm``), here on a frontend in-process that is a client of the session's EngineCore
(tests/helpers/enginecore_session.py: no engine of its own), with the direct path's link and
text layer. Each test starts an answer that would run for thousands of tokens, ends it early
in one way, and then asserts, from what crossed the client's sockets and from vLLM:

- exactly one ADD and exactly one ABORT for it left the frontend;
- vLLM's scheduler runs and queues nothing and its KV cache is empty again (its own
  figures, sent with a probe's step: :func:`~tests.helpers.enginecore_session.scheduler_idle`);
- vLLM never finished it (no output of it carried a finish reason) and generated fewer
  tokens than it was asked for.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from tests.helpers.enginecore_session import (
    DirectFrontend,
    HeadlessEngine,
    scheduler_idle,
    start_direct_frontend,
)
from tests.helpers.http import raw_request, read_until
from tests.helpers.vllm import LONG, MAX_TOKENS, client
from tests.helpers.vllm_session import MODEL
from tests.helpers.waiting import HANG_GUARD
from trioserve.text.assets import ModelText

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def text(enginecore: HeadlessEngine) -> ModelText:
    return ModelText.load(enginecore.model_dir)


async def ended_early(direct: DirectFrontend) -> None:
    """The one request of the test was aborted once in vLLM, and never finished there."""
    tap = direct.tap
    [request_id] = tap.requests
    await tap.aborted_once(request_id)
    stats = await scheduler_idle(direct.client)
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert tap.aborted == [request_id]  # one ABORT, and none for anything else
    assert not tap.finished_in_engine(request_id)
    assert tap.generated(request_id) < MAX_TOKENS
    assert direct.client.in_flight == 0


async def test_disconnect_while_streaming_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    stream = await raw_request(
        direct.frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    await stream.aclose()
    await ended_early(direct)


async def test_disconnect_while_waiting_for_json_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    stream = await raw_request(
        direct.frontend, "POST", "/v1/completions", json.dumps(LONG).encode()
    )
    with trio.fail_after(HANG_GUARD):
        while not direct.tap.requests:
            await trio.sleep(0.02)
    await direct.tap.running(direct.tap.requests[0])
    await stream.aclose()
    await ended_early(direct)


async def test_deadline_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    async with client(direct.frontend.url) as http:
        answer = await http.post("/v1/completions", json=LONG, headers={"x-request-timeout": "1"})
    assert answer.status_code == 504, answer.text
    await ended_early(direct)


async def test_delete_request_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    async with (
        client(direct.frontend.url) as http,
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
    await ended_early(direct)


async def test_drain_deadline_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(
        nursery, enginecore, text, drain_delay=0.0, graceful_timeout=1.0
    )
    frontend = direct.frontend
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    nursery.start_soon(frontend.drain.drain)
    tail = await read_until(stream, b"server_shutting_down")
    assert b"[DONE]" not in tail
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    await ended_early(direct)


async def test_a_client_that_stops_reading_is_ended_and_aborted_in_vllm(
    enginecore, text, nursery
) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text, stream_buffer=8)
    frontend = direct.frontend
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    stream = trio.SocketStream(sock)
    body = json.dumps({**LONG, "stream": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await stream.send_all(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    # Never read: the frontend ends the request itself (slow_client) and aborts it.
    with trio.fail_after(HANG_GUARD * 3):
        while not direct.tap.aborted:
            await trio.sleep(0.05)
    await ended_early(direct)
    await stream.aclose()


# -- the WebSocket over the direct path ---------------------------------------------------


def ws_url(direct: DirectFrontend) -> str:
    return direct.frontend.url.replace("http", "ws") + "/v1/ws"


async def test_a_websocket_request_streams_the_json_answer_over_the_direct_path(
    enginecore, text, nursery
) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
    async with client(direct.frontend.url) as http:
        answer = (await http.post("/v1/completions", json=body)).json()
    chunks, done = [], None
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(ws_url(direct)) as ws:
            request = {"type": "request", "id": "s", "endpoint": "completions", "body": body}
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                chunks.append(message["data"])
            done = message
    assert done["type"] == "done", done
    assert len(chunks) > 1  # streamed, not one piece
    assert "".join(c["choices"][0]["text"] for c in chunks) == answer["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    usage = answer["usage"]
    assert done["usage"] == {k: usage[k] for k in done["usage"]}
    # Two requests, both finished by the engine: no ABORT.
    assert len(direct.tap.requests) == 2 and direct.tap.aborted == []
    assert all(direct.tap.finished_in_engine(r) for r in direct.tap.requests)


async def test_websocket_cancel_aborts_in_vllm(enginecore, text, nursery) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(ws_url(direct)) as ws:
            request = {"type": "request", "id": "w", "endpoint": "completions", "body": LONG}
            await ws.send_message(json.dumps(request))
            first = json.loads(await ws.get_message())
            assert first["type"] == "chunk", first
            await ws.send_message(json.dumps({"type": "cancel", "id": "w"}))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                pass
            assert message["error"]["code"] == "request_cancelled"
    await ended_early(direct)


async def test_closing_the_websocket_aborts_each_of_its_requests_once_in_vllm(
    enginecore, text, nursery
) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(ws_url(direct)) as ws:
            for name in ("a", "b"):
                request = {"type": "request", "id": name, "endpoint": "completions", "body": LONG}
                await ws.send_message(json.dumps(request))
            seen: set[str] = set()
            while seen != {"a", "b"}:
                message = json.loads(await ws.get_message())
                assert message["type"] == "chunk", message
                seen.add(message["id"])
    tap = direct.tap
    assert len(tap.requests) == 2
    for request_id in tap.requests:
        await tap.aborted_once(request_id)
    stats = await scheduler_idle(direct.client)
    assert (stats.num_running_reqs, stats.kv_cache_usage) == (0, 0.0)
    assert sorted(tap.aborted) == sorted(tap.requests)
    assert not any(tap.finished_in_engine(r) for r in tap.requests)
