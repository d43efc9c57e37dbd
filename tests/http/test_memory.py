"""The one accounting of memory clients make the server hold (``http/memory.py``): parsed
JSON counted as Python holds it, and WebSocket messages, in assembly and parsed, in the
body budget (``--max-body-memory-mb``) on both servers."""

from __future__ import annotations

import gc
import json
import tracemalloc

import orjson
import pytest
import trio
import wsproto
import wsproto.events as ws_events
from trio_websocket import open_websocket_url

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD, wait_until
from tests.helpers.websocket import receive, request, ws_url
from trioserve.http.memory import Holding, MemoryBudget, held_by

N = 5000
SHAPES = {
    "small ints": "[" + ",".join("0" for _ in range(N)) + "]",
    "floats": "[" + ",".join("1.5" for _ in range(N)) + "]",
    "empty objects": "[" + ",".join("{}" for _ in range(N)) + "]",
    "empty lists": "[" + ",".join("[]" for _ in range(N)) + "]",
    "short strings": "[" + ",".join(f'"{i % 100:02d}"' for i in range(N)) + "]",
    "many keys": "{" + ",".join(f'"{i:x}":0' for i in range(N)) + "}",
    "nested 1,000 deep": "[" * 1000 + "]" * 1000,
    "chat messages": json.dumps({"messages": [{"role": "user", "content": "hi"}] * N}),
    "prose": json.dumps({"prompt": "word, " * N}),
    "one emoji in ASCII": json.dumps({"prompt": "a" * N + "\U0001f600"}, ensure_ascii=False),
}


@pytest.mark.parametrize("text", SHAPES.values(), ids=SHAPES.keys())
def test_parsed_json_is_counted_as_what_python_holds_for_it(text):
    tracemalloc.start()
    try:
        parsed = orjson.loads(text)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    counted = held_by(parsed)
    # Never far under (a UTF-8 copy of a non-ASCII string is the most it misses), at
    # most a few times over (small ints and repeated keys are shared, counted each time).
    assert held <= 1.3 * counted
    assert counted <= 5 * held


def test_a_holding_handed_over_is_given_back_by_its_new_holder_only():
    budget = MemoryBudget(100, "things", "things_exhausted")
    first = Holding(budget)
    first.take(60)
    second = first.hand_over()
    first.release()
    assert budget.held == 60
    second.release()
    second.release()
    assert budget.held == 0


async def end_of(ws, client_id: str) -> dict:
    """The message that ends request ``client_id`` (done or error), the others' skipped."""
    while True:
        message = await receive(ws)
        if message["id"] == client_id and message["type"] in ("done", "error"):
            return message


async def test_a_websocket_message_and_its_parse_are_held_in_the_body_budget(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, max_body_memory_bytes=300_000
    )
    budget = frontend.app.services.body_budget
    async with open_websocket_url(ws_url(frontend)) as ws:
        # 200 kB of text: 200 kB as the message, 200 kB more parsed: past the budget.
        await ws.send_message(request("big", "x" * 200_000, 2))
        error = await receive(ws)
        assert (error["type"], error["id"]) == ("error", "big")
        assert error["error"]["code"] == "body_memory_exhausted"
        assert budget.held == 0
        # A request in flight holds its message until it ends; what fits is served.
        await ws.send_message(request("held", "x" * 100_000, 100_000))
        await wait_until(lambda: budget.held >= 200_000, "the running request's message")
        await ws.send_message(request("refused", "x" * 60_000, 2))
        assert (await end_of(ws, "refused"))["error"]["code"] == "body_memory_exhausted"
        await ws.send_message(request("small", "hello", 2))
        assert (await end_of(ws, "small"))["type"] == "done"
        await ws.send_message(json.dumps({"type": "cancel", "id": "held"}))
        await end_of(ws, "held")
        await wait_until(lambda: budget.held == 0, "the ended request's message given back")
        await ws.send_message(request("again", "x" * 60_000, 2))
        assert (await end_of(ws, "again"))["type"] == "done"


async def _raw_websocket(frontend) -> tuple[trio.SocketStream, wsproto.WSConnection]:
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await stream.send_all(ws.send(ws_events.Request(host="x", target="/v1/ws")))
    with trio.fail_after(HANG_GUARD):
        while True:
            ws.receive_data(await stream.receive_some(65536))
            if any(isinstance(e, ws_events.AcceptConnection) for e in ws.events()):
                return stream, ws


async def _close_code(stream: trio.SocketStream, ws: wsproto.WSConnection) -> int | None:
    with trio.fail_after(HANG_GUARD):
        while data := await stream.receive_some(65536):
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, ws_events.CloseConnection):
                    return event.code
    return None


async def test_a_websocket_message_in_assembly_is_held_in_the_body_budget(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        max_body_memory_bytes=300_000,
        ws_max_message_bytes=1024 * 1024,
    )
    budget = frontend.app.services.body_budget
    stream, ws = await _raw_websocket(frontend)
    # Half a message, in fragments, then nothing: its bytes are counted meanwhile.
    for _ in range(4):
        fragment = ws_events.TextMessage(data="x" * 50_000, message_finished=False)
        await stream.send_all(ws.send(fragment))
    await wait_until(lambda: budget.held >= 200_000, "the fragments to be counted")
    # Another client's body does not fit beside them.
    async with frontend.client() as client:
        body = {"prompt": "x" * 60_000, "max_tokens": 1}
        refused = await client.post("/v1/completions", json=body)
        assert refused.json()["error"]["code"] == "body_memory_exhausted"
        # Past the budget, the socket in assembly is closed with 1013 (try again later).
        for _ in range(2):
            fragment = ws_events.TextMessage(data="x" * 50_000, message_finished=False)
            await stream.send_all(ws.send(fragment))
        assert await _close_code(stream, ws) == 1013
        await stream.aclose()
        await wait_until(lambda: budget.held == 0, "the half message given back")
        assert (await client.post("/v1/completions", json=body)).status_code == 200


def _left_to_the_collector() -> list[str]:
    """What of trioserve's a full collection would free now: what only reference
    cycles keep (the server tunes the collector to run seldom, so that waits long)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = {
            type(obj).__name__ + (f" {obj.f_code.co_name}" if hasattr(obj, "f_code") else "")
            for obj in gc.garbage
            # (hypercorn's connection, a subclass of ours, is in a cycle of hypercorn's
            # own: it holds nothing of the request once its stream has closed.)
            if (
                type(obj).__module__.startswith("trioserve")
                and type(obj).__module__ != "trioserve.server.hypercorn"
            )
            or (hasattr(obj, "f_code") and "/trioserve/" in obj.f_code.co_filename)
        }
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()  # (saved, they were not freed: now they are)
    return sorted(found)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "x" * 2**20}], "max_tokens": 2},
        {"messages": [{"role": "user", "content": "x" * 2**20}], "max_tokens": "many"},  # 422
        {"messages": [{"role": "user", "content": "x" * 2**20}], "max_tokens": 2, "stream": True},
    ],
    ids=["json", "invalid", "stream"],
)
async def test_a_request_ended_leaves_nothing_for_the_garbage_collector(nursery, http_server, body):
    """A reference cycle kept each request whole, its body included, until the collector
    ran: a 16 MiB body left 16 MiB of RSS per request (issue 27)."""
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        await client.get("/live")
        _left_to_the_collector()  # what start-up left
        gc.disable()
        try:
            answer = await client.post(
                "/v1/chat/completions", json=body, headers={"connection": "close"}
            )
            assert answer.status_code in (200, 422)
            await wait_until(lambda: not frontend.app.services.registry, "the request's end")
            await trio.sleep(0.1)  # the connection's close
            assert _left_to_the_collector() == []
        finally:
            gc.enable()
