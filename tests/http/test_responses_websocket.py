"""The Responses endpoint of /v1/ws: the same typed events as SSE, cancellable."""

from __future__ import annotations

import json
import logging

import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.responses import aborts_sent, check_sequence, start_natural_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import expected_text


@pytest.fixture
async def engine(nursery):
    return await start_natural_engine(nursery)


def ws_url(frontend) -> str:
    return f"ws://{frontend.host}:{frontend.port}/v1/ws"


async def receive(ws) -> dict:
    with trio.fail_after(HANG_GUARD):
        return json.loads(await ws.get_message())


async def until_end(ws, client_id: str) -> list[dict]:
    messages = []
    while True:
        message = await receive(ws)
        assert message["id"] == client_id
        messages.append(message)
        if message["type"] in ("done", "error"):
            return messages


def ws_request(client_id: str, **body: object) -> str:
    return json.dumps({"type": "request", "id": client_id, "endpoint": "responses", "body": body})


async def test_websocket_carries_the_same_typed_events(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(ws_request("a", input="hello there"))
        messages = await until_end(ws, "a")
    *events, done = messages
    assert {m["type"] for m in events} == {"event"}
    check_sequence([m["data"]["type"] for m in events], "response.completed")
    assert [m["data"]["sequence_number"] for m in events] == list(range(len(events)))
    deltas = [m["data"]["delta"] for m in events if m["data"]["type"].endswith(".delta")]
    assert "".join(deltas) == expected_text("hello there", 16)
    assert done["type"] == "done"
    assert done["usage"]["output_tokens"] == 16 and done["usage"]["input_tokens"] == 2
    response_id = events[-1]["data"]["response"]["id"]
    async with frontend.client() as client:  # kept, as over HTTP (store: true)
        assert (await client.get(f"/v1/responses/{response_id}")).json()["status"] == "completed"


async def test_websocket_cancel_ends_a_response_with_one_abort(frontend):
    before = aborts_sent("cancel")
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(ws_request("c", input="go", max_output_tokens=100_000))
        first = await receive(ws)
        assert first["data"]["type"] == "response.created"
        await ws.send_message(json.dumps({"type": "cancel", "id": "c"}))
        messages = await until_end(ws, "c")
    failed = [m for m in messages if m["type"] == "event"][-1]["data"]
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "cancelled"
    assert messages[-1]["type"] == "error"
    assert messages[-1]["error"]["code"] == "request_cancelled"
    core = frontend.engine.core
    await wait_until(
        lambda: any(rid.endswith(".c") for _, rid in core.ends), "the engine to see c end"
    )
    assert [hows for (_, rid), hows in core.ends.items() if rid.endswith(".c")] == [["aborted"]]
    assert aborts_sent("cancel") == before + 1
    assert core.stats.unknown_aborts == 0


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"input": "x", "background": True}, "invalid_request"),
        ({"input": 5}, "invalid_request"),
    ],
)
async def test_websocket_refuses_what_it_cannot_serve(frontend, body, code):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(ws_request("b", **body))
        [error] = await until_end(ws, "b")
        await ws.send_message(json.dumps({"type": "request", "id": "e", "endpoint": "nope"}))
        unknown = await receive(ws)
    assert error["type"] == "error" and error["error"]["code"] == code
    assert unknown["error"]["code"] == "invalid_endpoint"
    assert "responses" in unknown["error"]["message"]


async def test_a_responses_request_gets_its_access_log_line(frontend, caplog):
    caplog.set_level(logging.INFO, logger="trioserve.access")

    def lines() -> list[dict]:
        return [r.access for r in caplog.records if r.name == "trioserve.access"]

    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(ws_request("a", input="hello there", max_output_tokens=3))
        messages = await until_end(ws, "a")
        await wait_until(lambda: len(lines()) == 1, "the request's line")
    line = lines()[0]  # (the socket's own line follows when it closes)
    assert (line["method"], line["protocol"], line["status"]) == ("WS", "responses", 200)
    assert (line["completion_tokens"], line["end"]) == (3, "completed")
    # Every message of the request, counted as sent.
    assert line["bytes"] == sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)
