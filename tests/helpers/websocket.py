"""The WebSocket protocol of ``GET /v1/ws``, from a client's side (trio-websocket)."""

from __future__ import annotations

import json

import trio

from tests.helpers.waiting import HANG_GUARD


def ws_url(frontend) -> str:
    return f"ws://{frontend.host}:{frontend.port}/v1/ws"


def request(client_id: str, prompt: str, max_tokens: int = 5, **body: object) -> str:
    return json.dumps(
        {
            "type": "request",
            "id": client_id,
            "endpoint": "completions",
            "body": {"prompt": prompt, "max_tokens": max_tokens, **body},
        }
    )


async def receive(ws) -> dict:
    with trio.fail_after(HANG_GUARD):
        return json.loads(await ws.get_message())


async def collect(ws, ids: set[str]) -> dict[str, list[dict]]:
    """Read until every id in ``ids`` has ended (done or error)."""
    seen: dict[str, list[dict]] = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        message = await receive(ws)
        seen[message["id"]].append(message)
        if message["type"] in ("done", "error"):
            open_ids.discard(message["id"])
    return seen
