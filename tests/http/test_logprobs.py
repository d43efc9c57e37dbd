"""Log probabilities an engine sends with its deltas reach the client: merged in a JSON
answer, one piece per chunk in a stream (SSE and WebSocket), in OpenAI's shapes."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.frontends import start_frontend
from tests.helpers.waiting import HANG_GUARD
from trioserve.http.writers.openai import merge_logprobs
from trioserve.protocol import ModelCard, Submit, Usage
from trioserve.sdk import Output, serve_engine

TOKENS = ["Hel", "lo", "!"]


def chat_piece(token: str) -> list[dict[str, Any]]:
    entry = {"token": token, "logprob": -0.5, "bytes": list(token.encode())}
    return [{**entry, "top_logprobs": [entry]}]


def completion_piece(token: str, offset: int) -> dict[str, list[Any]]:
    return {
        "text_offset": [offset],
        "token_logprobs": [-0.5],
        "tokens": [token],
        "top_logprobs": [{token: -0.5}],
    }


class LogprobsBackend:
    """Three tokens, each with its log probabilities when the request asked for them."""

    engine_id = "logprobs"
    models = [ModelCard("lp")]
    capabilities = ["chat", "completion"]

    async def generate(self, request: Submit):
        asked = request.params.get("logprobs")
        offset = 0
        for index, token in enumerate(TOKENS):
            logprobs = None
            if asked is not None and asked is not False:
                chat = request.task == "chat"
                logprobs = chat_piece(token) if chat else completion_piece(token, offset)
            offset += len(token)
            last = index == len(TOKENS) - 1
            yield Output(
                data=token,
                logprobs=logprobs,
                finish_reason="length" if last else None,
                usage=Usage(1, len(TOKENS)) if last else None,
            )
            await trio.lowlevel.checkpoint()


@pytest.fixture
async def frontend(nursery, http_server):
    engine = await nursery.start(
        partial(serve_engine, LogprobsBackend(), "tcp://127.0.0.1:*", track_ends=True)
    )
    return await start_frontend(nursery, engine, server=http_server)


CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
COMPLETION = ("/v1/completions", {"prompt": "hi"})


def whole(path: str) -> Any:
    if path == CHAT[0]:
        return {"content": [entry for token in TOKENS for entry in chat_piece(token)]}
    return {
        "text_offset": [0, 3, 5],
        "token_logprobs": [-0.5] * 3,
        "tokens": TOKENS,
        "top_logprobs": [{token: -0.5} for token in TOKENS],
    }


@pytest.mark.parametrize(("path", "body", "asked"), [(*CHAT, True), (*COMPLETION, 0)])
async def test_json_answers_carry_every_deltas_logprobs_merged(frontend, path, body, asked):
    async with frontend.client() as client:
        answer = (await client.post(path, json={**body, "logprobs": asked})).json()
        plain = (await client.post(path, json=body)).json()
    assert answer["choices"][0]["logprobs"] == whole(path)
    assert plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("path", "body", "asked"), [(*CHAT, True), (*COMPLETION, 0)])
async def test_streamed_chunks_carry_their_own_logprobs(frontend, http_server, path, body, asked):
    pieces, text = [], ""
    async with (
        frontend.client() as client,
        client.stream("POST", path, json={**body, "logprobs": asked, "stream": True}) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice["logprobs"] is not None:
                    pieces.append(choice["logprobs"])
                    text += choice.get("text") or choice.get("delta", {}).get("content") or ""
    assert text == "".join(TOKENS)
    if path == CHAT[0]:
        assert pieces == [{"content": chat_piece(token)} for token in TOKENS]
    else:
        assert [p["tokens"] for p in pieces] == [[token] for token in TOKENS]
        assert [p["text_offset"] for p in pieces] == [[0], [3], [5]]


@pytest.mark.parametrize(("path", "body", "asked"), [(*CHAT, True), (*COMPLETION, 2)])
async def test_each_of_n_choices_carries_its_own_logprobs(frontend, path, body, asked):
    request = {**body, "logprobs": asked, "n": 2}
    async with frontend.client() as client:
        answer = (await client.post(path, json=request)).json()
        streamed: dict[int, Any] = {}
        async with client.stream("POST", path, json={**request, "stream": True}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        piece = choice["logprobs"]
                        if piece is not None:
                            piece = piece.get("content", piece)
                            streamed[choice["index"]] = merge_logprobs(
                                streamed.get(choice["index"]), piece
                            )
    assert [c["logprobs"] for c in answer["choices"]] == [whole(path)] * 2
    merged = whole(path)
    assert streamed == {i: merged.get("content", merged) for i in (0, 1)}


async def test_websocket_chunks_carry_their_logprobs(frontend):
    url = f"ws://{frontend.host}:{frontend.port}/v1/ws"
    request = {"type": "request", "id": "a", "endpoint": "chat.completions"}
    request["body"] = {**CHAT[1], "logprobs": True}
    pieces = []
    with trio.fail_after(HANG_GUARD):
        async with open_websocket_url(url) as ws:
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                logprobs = message["data"]["choices"][0]["logprobs"]
                if logprobs is not None:
                    pieces.append(logprobs["content"])
    assert message["type"] == "done"
    assert pieces == [chat_piece(token) for token in TOKENS]
