"""GET /v1/ws with trio-websocket as the client: multiplexing, cancels, closes, limits."""

from __future__ import annotations

import json
import re

import pytest
import trio
import trio.testing
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    open_websocket_url,
    wrap_client_stream,
)

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD, wait_until
from tests.helpers.websocket import collect, receive, request, ws_url
from trioserve import metrics
from trioserve.engine_programs.mock import expected_text
from trioserve.http.websocket import WebSocketConnection


def text_of(messages: list[dict]) -> str:
    return "".join(m["data"]["choices"][0]["text"] for m in messages if m["type"] == "chunk")


def engine_ids(frontend, client_id: str) -> list[str]:
    return [
        how
        for (_, rid), hows in frontend.engine.core.ends.items()
        if rid.endswith("." + client_id)
        for how in hows
    ]


async def test_concurrent_requests_each_receive_exactly_their_own_chunks(frontend):
    prompts = {f"r{i}": f"prompt number {i}" for i in range(6)}
    async with open_websocket_url(ws_url(frontend)) as ws:
        for client_id, prompt in prompts.items():
            await ws.send_message(request(client_id, prompt, max_tokens=8))
        seen = await collect(ws, set(prompts))
    for client_id, prompt in prompts.items():
        messages = seen[client_id]
        assert text_of(messages) == expected_text(prompt, 8)
        assert messages[-1] == {
            "type": "done",
            "id": client_id,
            "usage": {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11},
        }
        chunks = [m["data"] for m in messages if m["type"] == "chunk"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[0]["object"] == "text_completion"  # the SSE route's chunk object


async def test_chat_endpoint_uses_the_chat_chunk_object(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(
            json.dumps(
                {
                    "type": "request",
                    "id": "c",
                    "endpoint": "chat.completions",
                    "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                }
            )
        )
        messages = (await collect(ws, {"c"}))["c"]
    first = messages[0]["data"]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"


async def test_cancel_ends_one_request_with_its_abort_and_the_others_complete(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("long", "p", max_tokens=100_000))
        for i in range(3):
            await ws.send_message(request(f"short{i}", f"s{i}", max_tokens=20))
        first = await receive(ws)
        pending = [first]
        while not any(m["id"] == "long" for m in pending):
            pending.append(await receive(ws))
        await ws.send_message(json.dumps({"type": "cancel", "id": "long"}))
        seen = await collect(
            ws,
            {"long", "short0", "short1", "short2"}
            - {m["id"] for m in pending if m["type"] in ("done", "error")},
        )
    all_messages = pending + [m for ms in seen.values() for m in ms]
    long_end = [m for m in all_messages if m["id"] == "long" and m["type"] != "chunk"]
    assert long_end[-1]["type"] == "error"
    assert long_end[-1]["error"]["code"] == "request_cancelled"
    for i in range(3):
        done = [m for m in all_messages if m["id"] == f"short{i}" and m["type"] == "done"]
        assert len(done) == 1
    await wait_until(lambda: engine_ids(frontend, "long"), "the abort")
    assert engine_ids(frontend, "long") == ["aborted"]


async def test_closing_the_socket_aborts_every_request_on_it(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        for i in range(4):
            await ws.send_message(request(f"c{i}", "p", max_tokens=100_000))
        for _ in range(4):
            await receive(ws)
        await wait_until(lambda: len(frontend.engine.core.running) == 4, "four running")
    await wait_until(lambda: not frontend.engine.core.running, "every abort")
    assert [engine_ids(frontend, f"c{i}") for i in range(4)] == [["aborted"]] * 4
    assert frontend.engine.core.stats.unknown_aborts == 0
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the registry to empty")


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{not json", "invalid_json"),
        ('["a list"]', "invalid"),
        ('{"type": "shout", "id": "x"}', "unknown_message_type"),
        ('{"type": "request", "id": "", "endpoint": "completions", "body": {}}', "invalid_id"),
        (
            '{"type": "request", "id": "x", "endpoint": "embeddings", "body": {}}',
            "invalid_endpoint",
        ),
        (
            '{"type": "request", "id": "x", "endpoint": "completions", "body": {}}',
            "invalid_request",
        ),
        ('{"type": "cancel", "id": "nobody"}', "not_found"),
    ],
)
async def test_bad_messages_get_an_error_and_the_socket_stays_open(frontend, message, code):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(message)
        answer = await receive(ws)
        assert answer["type"] == "error" and answer["error"]["code"] == code
        await ws.send_message(request("ok", "still here", max_tokens=2))
        seen = await collect(ws, {"ok"})
        assert seen["ok"][-1]["type"] == "done"


NESTED = "[" * 1000 + "]" * 1000


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('{"type": "request", "id": "x", "endpoint": [], "body": {}}', "invalid_endpoint"),
        ('{"type": "request", "id": "x", "endpoint": {"a": 1}, "body": {}}', "invalid_endpoint"),
        ('{"type": "ping", "id": ' + NESTED + "}", "invalid_id"),
        ('{"type": "ping", "id": {"a": []}}', "invalid_id"),
        ('{"type": ' + NESTED + ', "id": "x"}', "unknown_message_type"),
        ('{"type": "cancel", "id": ' + NESTED + "}", "invalid_id"),
        (
            '{"type": "request", "id": "x", "endpoint": "chat.completions", "body": []}',
            "invalid_request",
        ),
        (
            '{"type": "request", "id": "x", "endpoint": "completions", "body": {"prompt": "p"},'
            ' "timeout": ' + NESTED + "}",
            "invalid_request_timeout",
        ),
        (
            '{"type": "request", "id": "x", "endpoint": "completions", "body": {"prompt": '
            + NESTED
            + "}}",
            "invalid_request",
        ),
    ],
)
async def test_messages_that_do_not_fit_the_schema_get_a_4xx_and_the_others_go_on(
    frontend, message, code, caplog
):
    """Wrong types anywhere, at any depth (issue 27): an error event for that message,
    never a 1011 and a traceback; the request running on the socket goes on to its end."""
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("running", "p", max_tokens=30))
        await ws.send_message(message)
        seen = []
        while not (seen and seen[-1]["id"] == "running" and seen[-1]["type"] == "done"):
            seen.append(await receive(ws))
    errors = [m for m in seen if m["type"] == "error"]
    assert len(errors) == 1 and errors[0]["error"]["code"] == code, errors
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_invalid_body_error_lists_field_paths(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("bad", "p", max_tokens="lots"))
        answer = await receive(ws)
    assert answer["id"] == "bad" and answer["error"]["code"] == "invalid_request"
    assert answer["error"]["details"][0]["loc"] == "$.max_tokens"


async def test_application_ping(frontend):
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message('{"type": "ping", "id": "p1"}')
        assert await receive(ws) == {"type": "pong", "id": "p1"}


async def test_per_connection_limit_refuses_the_extra_request_only(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, ws_max_requests=2)
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("a", "p", max_tokens=100_000))
        await ws.send_message(request("b", "p", max_tokens=100_000))
        await ws.send_message(request("c", "p", max_tokens=100_000))
        messages = [await receive(ws) for _ in range(6)]
        refused = [m for m in messages if m["type"] == "error"]
        assert [(m["id"], m["error"]["code"]) for m in refused] == [("c", "too_many_requests")]
        await ws.send_message(json.dumps({"type": "cancel", "id": "a"}))
        # "a" counts until its end has been written; then "d" has a place.
        while not ((m := await receive(ws))["id"] == "a" and m["type"] == "error"):
            pass
        await ws.send_message(request("d", "p", max_tokens=2))
        while True:
            message = await receive(ws)
            if message["id"] == "d" and message["type"] in ("done", "error"):
                assert message["type"] == "done"
                break


async def test_a_message_over_the_size_limit_closes_with_1009(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, ws_max_message_bytes=1000)
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("big", "x" * 2000))
        with pytest.raises(ConnectionClosed) as info:
            await receive(ws)
    assert info.value.reason.code == 1009


async def test_a_reader_that_stops_is_bounded_and_its_requests_aborted(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, stream_buffer=8)
    before = metrics.REGISTRY.get_sample_value(
        "trioserve_engine_aborts_total", {"reason": "slow_client"}
    )
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    async with trio.open_nursery() as client_nursery:
        ws = await wrap_client_stream(
            client_nursery,
            trio.SocketStream(sock),
            frontend.host,
            "/v1/ws",
            message_queue_size=0,
        )
        await ws.send_message(
            request("flood", "p", max_tokens=10_000_000, mock_tokens_per_second=1e6)
        )
        # Never read again: the server must end the request by itself.
        await wait_until(lambda: engine_ids(frontend, "flood"), "the slow reader's abort")
        assert engine_ids(frontend, "flood") == ["aborted"]
        after = metrics.REGISTRY.get_sample_value(
            "trioserve_engine_aborts_total", {"reason": "slow_client"}
        )
        assert after == before + 1
        client_nursery.cancel_scope.cancel()


async def test_drain_deadline_closes_with_1001_and_aborts(nursery, engine, http_server):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=0.3
    )
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("d1", "p", max_tokens=100_000))
        await ws.send_message(request("d2", "p", max_tokens=100_000))
        await receive(ws)
        await wait_until(lambda: len(frontend.engine.core.running) == 2, "two running")
        nursery.start_soon(frontend.drain.drain)
        errors = []
        with pytest.raises(ConnectionClosed) as info:
            while True:
                message = await receive(ws)
                if message["type"] == "error":
                    errors.append(message)
    assert info.value.reason.code == 1001
    assert sorted((m["id"], m["error"]["code"]) for m in errors) == [
        ("d1", "server_shutting_down"),
        ("d2", "server_shutting_down"),
    ]
    await wait_until(
        lambda: engine_ids(frontend, "d1") and engine_ids(frontend, "d2"), "both aborts"
    )
    assert engine_ids(frontend, "d1") == engine_ids(frontend, "d2") == ["aborted"]


async def test_request_ids_are_unguessable_so_strangers_cannot_cancel_by_scanning(frontend):
    # They were ws<connection>-<n>.<client id>: a few DELETEs found a stranger's request.
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("a", "p", max_tokens=100_000, stream=True))
        first = await receive(ws)
        assert first["type"] == "chunk"
        server_id = first["data"]["id"].removeprefix("cmpl-")
        assert re.fullmatch(r"ws-[0-9a-f]{32}\.a", server_id), server_id
        async with frontend.client() as client:
            for guess in [f"ws{n}-{m}.a" for n in range(1, 20) for m in range(1, 4)]:
                assert (await client.delete(f"/v1/requests/{guess}")).status_code == 404
            assert (await client.delete(f"/v1/requests/{server_id}")).status_code == 200
        assert (await receive_until_end(ws, "a"))["error"]["code"] == "request_cancelled"


async def receive_until_end(ws, client_id: str) -> dict:
    while True:
        message = await receive(ws)
        if message["id"] == client_id and message["type"] in ("done", "error"):
            return message


async def _handshake(frontend, origin: str | None) -> int:
    """101 if the socket opened with ``Origin: origin``, else the refusal's status."""
    headers = [(b"origin", origin.encode())] if origin is not None else []
    try:
        with trio.fail_after(HANG_GUARD):
            async with open_websocket_url(ws_url(frontend), extra_headers=headers) as ws:
                await ws.send_message(json.dumps({"type": "ping", "id": "p"}))
                assert (await receive(ws))["type"] == "pong"
                return 101
    except ConnectionRejected as rejected:
        if rejected.status_code == 403 and rejected.body:
            assert json.loads(rejected.body)["error"]["code"] == "websocket_origin_not_allowed"
        return rejected.status_code


@pytest.mark.parametrize(
    ("settings", "origin", "status"),
    [
        ({}, None, 101),  # not a browser
        ({}, "https://evil.example", 403),  # cross-site WebSocket hijacking
        ({}, "null", 403),
        ({}, "SAME", 101),  # a page this server served
        ({"cors_origins": ["https://app.example"]}, "https://app.example", 101),
        ({"cors_origins": ["https://app.example"]}, "https://evil.example", 403),
        ({"ws_allow_any_origin": True}, "https://evil.example", 101),
    ],
)
async def test_a_browser_of_another_origin_cannot_open_the_socket(
    nursery, http_server, settings, origin, status
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, **settings)
    if origin == "SAME":
        origin = f"http://{frontend.host}:{frontend.port}"
    assert await _handshake(frontend, origin) == status
    assert engine.core.stats.submitted == 0


async def test_cancelled_requests_count_against_the_limits_until_they_have_ended(
    nursery, engine, http_server
):
    # A client that never reads and sends request+cancel pairs: each cancelled request
    # waits to write its end. It used to leave the connection's count at the cancel while
    # still holding a server-wide admission slot, so one socket could take them all.
    frontend = await start_frontend(nursery, engine, server=http_server, ws_max_requests=3)
    services = frontend.app.services
    incoming = [{"type": "websocket.connect"}]
    for i in range(10):
        incoming.append({"type": "websocket.receive", "text": request(f"r{i}", "p")})
        incoming.append(
            {"type": "websocket.receive", "text": json.dumps({"type": "cancel", "id": f"r{i}"})}
        )
    send_channel, receive_channel = trio.open_memory_channel(len(incoming))
    for message in incoming:
        send_channel.send_nowait(message)

    async def receive():
        return await receive_channel.receive()

    reads = trio.Event()

    async def send(message):
        if message["type"] != "websocket.accept":
            await reads.wait()  # a client that does not read: every write waits

    connection = WebSocketConnection(services, receive, send)
    async with trio.open_nursery() as client:
        client.start_soon(connection.serve)
        try:
            await trio.testing.wait_all_tasks_blocked()
            assert services.admission.in_use <= 3
        finally:
            reads.set()  # (the connection's sends are shielded: let them finish)
            client.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("keys", "authorization", "status", "code"),
    [
        ([], None, 404, "not_found"),
        (["sk-a"], None, 401, "invalid_api_key"),  # unknown paths are not probed without a key
        (["sk-a"], "Bearer sk-a", 404, "not_found"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/models", "/ws", "/nope"])
async def test_an_upgrade_on_another_path_is_refused_before_the_upgrade(
    nursery, http_server, keys, authorization, status, code, path
):
    # docs/websocket.md: a 404 (as the same path over HTTP) with the error body, never a
    # socket opened and closed; both servers alike.
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, api_keys=keys)
    headers = [(b"authorization", authorization.encode())] if authorization else []
    url = f"ws://{frontend.host}:{frontend.port}{path}"
    with pytest.raises(ConnectionRejected) as rejected, trio.fail_after(HANG_GUARD):
        async with open_websocket_url(url, extra_headers=headers):
            pass
    assert rejected.value.status_code == status
    error = json.loads(rejected.value.body)["error"]
    assert error["code"] == code
    if status == 404:
        assert error["message"] == f"no WebSocket route at {path} (it is /v1/ws)"
    assert engine.core.stats.submitted == 0


async def test_a_socket_with_nothing_in_flight_past_the_idle_timeout_closes_with_1001(
    nursery, engine, http_server
):
    frontend = await start_frontend(nursery, engine, server=http_server, ws_idle_timeout=1.0)
    async with open_websocket_url(ws_url(frontend)) as ws:
        # A request that runs longer than the timeout: the socket is not idle meanwhile.
        await ws.send_message(request("slow", "a slow one", max_tokens=5, mock_stall_s=1.5))
        seen = await collect(ws, {"slow"})
        assert seen["slow"][-1]["type"] == "done"
        with trio.fail_after(HANG_GUARD), pytest.raises(ConnectionClosed) as info:
            await receive(ws)
    assert info.value.reason.code == 1001
    assert frontend.app.services.connections == set()
