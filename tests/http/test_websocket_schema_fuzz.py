"""Seeded fuzzing of /v1/ws's message schema, on both servers: valid messages with fields
replaced by JSON of any type and depth (issue 27). Each gets an answer of its own (an
error event of a 4xx, a pong, or its request run), never a close, a 5xx or a logged
traceback, and a request running on the socket meanwhile streams to its end."""

from __future__ import annotations

import json
import random

from trio_websocket import open_websocket_url

from tests.helpers.websocket import receive, request, ws_url

BASES = [
    {
        "type": "request",
        "id": "f",
        "endpoint": "completions",
        "body": {"prompt": "p", "max_tokens": 1},
    },
    {
        "type": "request",
        "id": "f",
        "endpoint": "chat.completions",
        "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    },
    {
        "type": "request",
        "id": "f",
        "endpoint": "responses",
        "body": {"input": "hi", "max_output_tokens": 1},
    },
    {"type": "cancel", "id": "f"},
    {"type": "ping", "id": "f"},
]


def any_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "object", "deep"])
    if depth > 3 and kind in ("list", "object"):
        kind = "str"
    if kind == "str":
        return rng.choice(["", "x", "completions", "responses", "ping", "é" * 3, "a" * 200])
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63)])
    if kind == "float":
        return rng.choice([0.5, -1e300, 1e-300])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [any_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return {rng.choice(["a", "type", "id", "body"]): any_json(rng, depth + 1)}
    nested: object = rng.choice([[], {}, "x", 1])
    for _ in range(rng.randint(100, 900)):  # deep, within orjson's limit of 1,024
        nested = [nested] if rng.random() < 0.5 else {"k": nested}
    return nested


def mutate(rng: random.Random, message: dict) -> dict:
    """Replace one field (at the top or in the body) with any JSON."""
    message = json.loads(json.dumps(message))
    target = message
    if "body" in message and rng.random() < 0.5:
        target = message["body"]
    keys = list(target) + ["extra"]
    target[rng.choice(keys)] = any_json(rng)
    return message


async def test_messages_of_any_shape_get_their_own_answer_and_the_socket_goes_on(frontend, caplog):
    rng = random.Random(27)
    async with open_websocket_url(ws_url(frontend), max_message_size=2**24) as ws:
        # (Fewer tokens than its stream buffer: this client reads only once it has sent.)
        await ws.send_message(request("running", "p", max_tokens=30))
        for i in range(150):
            message = mutate(rng, rng.choice(BASES))
            if message.get("id") == "f":
                message["id"] = f"f{i}"  # (its own id, when it still has one)
            await ws.send_message(json.dumps(message))
        # Every answer: a 4xx error, a pong, or a request's own events; the running
        # request ends with done.
        while True:
            answer = await receive(ws)
            assert answer["type"] in ("error", "pong", "chunk", "done", "event"), answer
            if answer["type"] == "error":
                status = answer["error"].get("code")
                assert answer["error"]["type"] != "server_error", answer
                assert status != "internal_error", answer
            if answer.get("id") == "running" and answer["type"] in ("done", "error"):
                assert answer["type"] == "done", answer
                break
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
