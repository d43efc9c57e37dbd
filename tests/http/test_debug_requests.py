"""``GET /debug/requests`` (http/routes/debug.py): the live view of the requests in
flight, off unless ``--debug-endpoints``, behind the API key when there are keys."""

from __future__ import annotations

import json

import trio
import trio_websocket

from tests.helpers.api_keys import ALICE, keyed_frontend
from tests.helpers.frontends import start_frontend
from tests.helpers.waiting import wait_until
from tests.helpers.websocket import receive, ws_url

#: A request the mock answers with one token and then holds until it is ended.
HOLD_STREAM = {
    "messages": [{"role": "user", "content": "hold"}],
    "max_tokens": 100,
    "stream": True,
    "mock_hang_after": 1,
}
#: One the mock never answers: it waits for its first output until it is ended.
HOLD_SILENT = {"prompt": "wait", "max_tokens": 5, "mock_hang_after": 0}


def ws_hold(client_id: str) -> str:
    body = {"prompt": client_id, "max_tokens": 100, "mock_hang_after": 1}
    return json.dumps({"type": "request", "id": client_id, "endpoint": "completions", "body": body})


async def test_without_the_flag_there_is_no_such_route(frontend):
    async with frontend.client() as client:
        answer = await client.get("/debug/requests")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


async def test_the_view_lists_every_request_where_it_is(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, debug_endpoints=True)
    registry = frontend.app.services.registry
    async with frontend.client() as client, trio.open_nursery() as requests:
        # An SSE stream that has had its first token, a JSON request still waiting for
        # its first output, and a WebSocket carrying two more.
        streaming = trio.Event()

        async def stream() -> None:
            headers = {"x-request-id": "dbg-stream"}
            body = HOLD_STREAM
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        streaming.set()

        requests.start_soon(stream)
        requests.start_soon(
            lambda: client.post(
                "/v1/completions", json=HOLD_SILENT, headers={"x-request-id": "dbg-json"}
            )
        )
        await streaming.wait()
        async with trio_websocket.open_websocket_url(ws_url(frontend)) as ws:
            await ws.send_message(ws_hold("w1"))
            await ws.send_message(ws_hold("w2"))
            assert (await receive(ws))["type"] == "chunk"
            assert (await receive(ws))["type"] == "chunk"
            await wait_until(lambda: len(registry) == 4, "four requests in flight")

            view = (await client.get("/debug/requests")).json()
            page = await client.get("/debug/requests", params={"format": "html"})
        await wait_until(lambda: len(registry) == 2, "the socket's requests to end")
        for request_id in ("dbg-stream", "dbg-json"):
            assert (await client.delete(f"/v1/requests/{request_id}")).status_code == 200

    assert view["in_flight"] == 4
    by_id = {entry["id"]: entry for entry in view["requests"]}
    assert set(by_id) == {"dbg-stream", "dbg-json"}
    stream_entry, json_entry = by_id["dbg-stream"], by_id["dbg-json"]
    assert stream_entry["route"] == "/v1/chat/completions"
    assert (stream_entry["transport"], json_entry["transport"]) == ("sse", "json")
    assert stream_entry["phase"] in ("streaming", "writing") and stream_entry["outputs"] == 1
    assert json_entry["phase"] == "waiting" and json_entry["outputs"] == 0
    assert json_entry["ttft_s"] is None and stream_entry["ttft_s"] > 0
    for entry in (stream_entry, json_entry):
        assert entry["model"] == "mock" and entry["engine"] == engine.address
        assert entry["client"].startswith("127.0.0.1:")
        assert entry["socket"] is None and entry["end_reason"] is None
        assert 0 < entry["deadline_left_s"] <= 600 and entry["age_s"] >= 0
    (socket,) = view["sockets"]
    assert socket["client"].startswith("127.0.0.1:")
    assert sorted(e["id"].rsplit(".", 1)[1] for e in socket["requests"]) == ["w1", "w2"]
    for entry in socket["requests"]:
        assert entry["socket"] == socket["socket"] and entry["transport"] == "ws"
        assert entry["route"] == "/v1/ws" and entry["outputs"] == 1

    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert '<meta http-equiv="refresh"' in html
    for request_id in ("dbg-stream", "dbg-json", *(e["id"] for e in socket["requests"])):
        assert request_id in html
    # Nothing from elsewhere: no scripts, styles or images to fetch.
    assert "src=" not in html and "href=" not in html and "<script" not in html


async def test_a_bad_format_is_a_400(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, debug_endpoints=True)
    async with frontend.client() as client:
        answer = await client.get("/debug/requests", params={"format": "xml"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_format"


async def test_with_api_keys_the_view_needs_one(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server, debug_endpoints=True)
    async with frontend.client() as client:
        assert (await client.get("/debug/requests")).status_code == 401
        answer = await client.get("/debug/requests", headers=ALICE)
    assert answer.status_code == 200 and answer.json()["in_flight"] == 0
