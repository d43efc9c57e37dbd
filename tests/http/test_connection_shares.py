"""What clients holding connections leave to the others: the probes are answered with
every connection slot held, and with API keys each key has its share of connections and
of WebSockets (docs/security.md, tenants)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD, wait_until
from tests.helpers.websocket import collect, receive, request, ws_url


async def fresh_get(frontend, path: str, key: str | None = None) -> httpx.Response:
    """``GET path`` on a connection of its own (a new client each time)."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=frontend.url, timeout=HANG_GUARD) as client:
        return await client.get(path, headers=headers)


async def test_with_every_connection_held_by_idle_websockets_the_probes_still_answer(
    nursery, http_server
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, max_connections=3)
    async with AsyncExitStack() as sockets:
        for _ in range(3):
            await sockets.enter_async_context(open_websocket_url(ws_url(frontend)))
        for path in ("/live", "/health"):
            assert (await fresh_get(frontend, path)).status_code == 200
        other = await fresh_get(frontend, "/v1/models")
        if http_server == "builtin":  # hypercorn has no bound on connections
            assert other.status_code == 503
            assert other.json()["error"]["code"] == "too_many_connections"
            assert other.headers["connection"] == "close"
        else:
            assert other.status_code == 200


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


async def open_socket(stack: AsyncExitStack, frontend, key: str):
    """A WebSocket of ``key`` kept open until ``stack`` closes, answering a ping."""
    ws = await stack.enter_async_context(
        open_websocket_url(ws_url(frontend), extra_headers=bearer(key))
    )
    await ws.send_message(json.dumps({"type": "ping", "id": "p"}))
    assert (await receive(ws))["type"] == "pong"
    return ws


async def rejected(frontend, key: str) -> tuple[int, str]:
    """The status and code of a refused WebSocket handshake of ``key``."""
    with pytest.raises(ConnectionRejected) as refusal, trio.fail_after(HANG_GUARD):
        async with open_websocket_url(ws_url(frontend), extra_headers=bearer(key)):
            pass
    return refusal.value.status_code, json.loads(refusal.value.body)["error"]["code"]


async def test_a_key_at_its_share_of_websockets_is_refused_and_another_key_opens_its_own(
    nursery, http_server
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, api_keys=["ka", "kb"], max_websockets_per_key=2
    )
    async with AsyncExitStack() as first:
        await open_socket(first, frontend, "ka")
        async with AsyncExitStack() as second:
            await open_socket(second, frontend, "ka")
            assert await rejected(frontend, "ka") == (429, "too_many_websockets_for_key")
            ws = await open_socket(second, frontend, "kb")  # the other key is not locked out
            await ws.send_message(request("r", "hello", 3))
            assert (await collect(ws, {"r"}))["r"][-1]["type"] == "done"
            await open_socket(second, frontend, "kb")
            assert await rejected(frontend, "kb") == (429, "too_many_websockets_for_key")
        # One of ka's sockets closed: ka may open another once the server has seen it.
        shares = frontend.app.services.websocket_shares
        await wait_until(lambda: shares.by_key.get(0) == 1, "ka's closed socket released")
        await open_socket(first, frontend, "ka")
    await wait_until(lambda: not shares.by_key, "every share released")


async def test_a_key_at_its_share_of_connections_is_refused_and_the_others_are_served(
    nursery, http_server
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        api_keys=["ka", "kb"],
        max_connections=4,  # 2 for each key
        keep_alive_timeout=3600,
    )
    async with AsyncExitStack() as held:
        clients = []
        for _ in range(2):  # ka's two connections, kept alive
            client = await held.enter_async_context(
                httpx.AsyncClient(
                    base_url=frontend.url,
                    timeout=HANG_GUARD,
                    limits=httpx.Limits(max_connections=1),
                )
            )
            assert (await client.get("/v1/models", headers=dict(bearer("ka")))).status_code == 200
            clients.append(client)
        third = await fresh_get(frontend, "/v1/models", "ka")
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "too_many_connections_for_key"
        assert third.headers["connection"] == "close"
        # A WebSocket is a connection too.
        assert await rejected(frontend, "ka") == (429, "too_many_connections_for_key")
        # The other key, and a probe without a key, still find connections.
        assert (await fresh_get(frontend, "/v1/models", "kb")).status_code == 200
        assert (await fresh_get(frontend, "/live")).status_code == 200
        # ka's held connections are still served.
        assert (await clients[0].get("/v1/models", headers=dict(bearer("ka")))).status_code == 200
        await clients[1].aclose()

        async def served() -> bool:
            return (await fresh_get(frontend, "/v1/models", "ka")).status_code == 200

        with trio.fail_after(HANG_GUARD):  # once the server has seen the close
            while not await served():
                await trio.sleep(0.01)
