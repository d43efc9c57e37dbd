"""What clients holding connections leave to the others: the probes are answered with
every connection slot held, and with API keys each key has its share of connections and
of WebSockets (docs/security.md, tenants)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
from trio_websocket import open_websocket_url

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD
from tests.helpers.websocket import ws_url


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
